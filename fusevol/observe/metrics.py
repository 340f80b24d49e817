"""Prometheus metrics: kubelet's names where kubelet has one, fusevol's own beside them.

The agent's (`Metrics`; `fusevol.observe.component_metrics` connects the components to them):

    storage_operation_duration_seconds{volume_plugin,operation_name,status}   kubelet's buckets
    volume_manager_total_volumes{plugin_name,state}        desired/actual state of world, on scrape
    rest_client_requests_total{code,host,method}           client-go's: API answers (API source)
    process_resident_memory_bytes, process_cpu_seconds_total, ...   the agent process, as kubelet's
    fusevol_ready                                          1 once /readyz answers 200
    fusevol_volume_failures{namespace,pod,volume,operation}   failing volumes, named
    fusevol_frozen_volumes{namespace,pod,volume}           containers reading a frozen volume
    fusevol_fuse_requests_total{operation}                 FUSE requests answered
    fusevol_fuse_read_bytes_total                          bytes read through the mount
    fusevol_fuse_inodes                                    the FUSE tree's inodes
    fusevol_fuse_pinned_names                              names whose kernel entries are kept
    fusevol_objects{kind}, fusevol_object_data_bytes       what the agent holds, on scrape
    fusevol_update_propagation_seconds                     object changed -> new version visible
    fusevol_source_restarts_total{source}                  watches / rescans started again
    fusevol_api_connections, fusevol_api_connections_made_total, fusevol_api_streams   (API source)

The webhook's (`WebhookMetrics`):

    fusevol_webhook_requests_total{code}                   answers, by HTTP status
    fusevol_webhook_conversions_total{result}              pods converted, unchanged or failed
    fusevol_webhook_admission_duration_seconds             an AdmissionReview's answer, made
    process_resident_memory_bytes, ...                     the webhook process

The only module that imports prometheus_client; every metric lives in one registry per agent
(`Metrics`) or webhook (`WebhookMetrics`), so tests can run several agents' worth of components in
one process. The chart's alert rules and dashboard (helm/fusevol/files/) query these names, and a
test holds that each exists in a running agent's `/metrics` (tests/observe).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

KUBELET_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600)
"""`storage_operation_duration_seconds` buckets (pkg/volume/util/metrics.go)."""

PROPAGATION_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

ADMISSION_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30)
"""kube-apiserver's `apiserver_admission_webhook_admission_duration_seconds` buckets: up to the
30 s a webhook configuration's `timeoutSeconds` allows."""

Gauges = Callable[[], Iterable[tuple[dict[str, str], float]]]
"""A callable giving (labels, value) pairs, read on every scrape."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.operation_duration = Histogram(
            "storage_operation_duration_seconds",
            "Storage operation duration",
            ["volume_plugin", "operation_name", "status"],
            buckets=KUBELET_BUCKETS,
            registry=self.registry,
        )
        self.update_propagation = Histogram(
            "fusevol_update_propagation_seconds",
            "Time from an object change reaching the agent to its new version being visible",
            buckets=PROPAGATION_BUCKETS,
            registry=self.registry,
        )
        self.source_restarts = Counter(
            "fusevol_source_restarts",
            "Watches or directory scans started again, by source",
            ["source"],
            registry=self.registry,
        )

    def add_gauge(self, name: str, documentation: str, labels: list[str], read: Gauges) -> None:
        """A gauge computed at scrape time from `read()`."""
        self.registry.register(_ScrapeTime(GaugeMetricFamily, name, documentation, labels, read))

    def add_counter(self, name: str, documentation: str, labels: list[str], read: Gauges) -> None:
        """A counter kept elsewhere as plain integers (a hot path), read at scrape time."""
        self.registry.register(_ScrapeTime(CounterMetricFamily, name, documentation, labels, read))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WebhookMetrics:
    """The admission webhook's metrics (module docstring); safe from the server's threads."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "fusevol_webhook_requests",
            "Requests answered, by HTTP status code",
            ["code"],
            registry=self.registry,
        )
        self.conversions = Counter(
            "fusevol_webhook_conversions",
            "Pods reviewed, by result: converted (a patch), unchanged (nothing to convert, or"
            " not a pod's creation), failed (an internal error: admitted unchanged)",
            ["result"],
            registry=self.registry,
        )
        self.admission_duration = Histogram(
            "fusevol_webhook_admission_duration_seconds",
            "Time to answer an AdmissionReview, from its body read to its answer made",
            buckets=ADMISSION_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ScrapeTime:
    def __init__(
        self,
        family: type[GaugeMetricFamily | CounterMetricFamily],
        name: str,
        documentation: str,
        labels: list[str],
        read: Gauges,
    ) -> None:
        self._family, self._name, self._documentation = family, name, documentation
        self._labels, self._read = labels, read

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        family = self._family(self._name, self._documentation, labels=self._labels)
        for labels, value in self._read():
            family.add_metric([labels[label] for label in self._labels], value)
        yield family

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return [self._family(self._name, self._documentation, labels=self._labels)]
