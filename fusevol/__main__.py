"""`python -m fusevol`: the same as the `fusevol` command."""

from fusevol.cli import main

raise SystemExit(main())
