"""fusevol's tests, grouped by what they run; docs/architecture.md says what each folder proves."""
