"""The operator's settings: one documented object, read from ``LOADLINE_*`` environment variables.

The Helm chart sets these as env on the operator Deployment; `loadline run` flags override them.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from typing import Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadline.errors import SpecError
from loadline.policy import Guard
from loadline.upgrade import RollMode

SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_PROCESS_SUFFIX = secrets.token_hex(3)  # drawn once: the identity must not change while we hold a Lease


class OperatorSettings(BaseSettings):
    """Everything an operator deployment may tune, from env ``LOADLINE_<FIELD>`` (``LOADLINE_NAMESPACES``)."""

    model_config = SettingsConfigDict(env_prefix="LOADLINE_", extra="ignore")

    namespaces: str = Field(
        default="", description="Comma-separated namespaces to watch; empty: the whole cluster."
    )
    prefix: str = Field(
        default="loadline.dev",
        description="Prefix of the finalizer and of the annotations in which the operator keeps state.",
    )
    field_manager: str = Field(default="loadline", description="Server-side apply field manager.")
    watch_server_timeout: int = Field(default=300, ge=10, description="Seconds the API server keeps a watch.")
    watch_client_timeout: int = Field(
        default=330, ge=10, description="Seconds before the client gives up a watch."
    )
    leader_election: bool = Field(
        default=False,
        description="Elect one active replica through a coordination.k8s.io/v1 Lease (the chart turns "
        "this on); off: this process reconciles on its own (one replica, or local runs).",
    )
    lease_name: str = Field(
        default="loadline", min_length=1, max_length=253, description="Name of the leader-election Lease."
    )
    lease_namespace: str = Field(
        default="",
        description="Namespace of the Lease; empty: env POD_NAMESPACE, then the pod's service-account "
        "namespace file.",
    )
    identity: str = Field(
        default="",
        description="This replica's holderIdentity; empty: env POD_NAME, else hostname_<random suffix>.",
    )
    lease_duration_seconds: int = Field(
        default=15, ge=1, description="A standby takes the Lease once it has gone unrenewed this long."
    )
    renew_deadline_seconds: int = Field(
        default=10, ge=1, description="A leader that cannot renew for this long stops (and exits)."
    )
    retry_period_seconds: int = Field(
        default=2, ge=1, description="How often the leader renews and a standby reads the Lease."
    )
    shards: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Split the InferenceModels between replicas by hash of their uid into this many "
        "shards, each owned through a Lease of its own (<lease name>-shard-<i>-of-<n>); needs "
        "kube-apiserver's ShardedListAndWatch feature gate (1.36+). 1: one replica reconciles all "
        "(elected when leader_election is on).",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        description="Replicas of the Deployment (the chart sets it): with shards, each replica first "
        "claims its fair share, ceil(shards / replicas), then any shard left free for a Lease duration.",
    )
    capacity_aware: bool = Field(
        default=True,
        description="Plan with the cluster's free GPUs (fall back to the next GPU type when full).",
    )
    prometheus_url: str = Field(
        default="",
        description="Prometheus to read vLLM metrics from just before a crash (e.g. http://prometheus:9090).",
    )
    measure_interval_seconds: int = Field(
        default=60,
        ge=0,
        description="How often to read each Ready or Degraded model's GPU memory from Prometheus "
        "(loadline's node agent or dcgm-exporter) into status.measuredGpuMemory; 0: never. Needs "
        "LOADLINE_PROMETHEUS_URL.",
    )
    hf_fetch: bool = Field(
        default=False,
        description="Fetch config.json from the Hugging Face hub for models that are not in the catalog.",
    )
    hf_endpoint: str = Field(default="https://huggingface.co", description="Hub (or mirror) to fetch from.")
    max_workers: int = Field(default=16, ge=1, le=256, description="Threads that run handlers in parallel.")
    retry_delay_seconds: int = Field(default=30, ge=1, description="Back-off when waiting on the cluster.")
    liveness_port: int = Field(default=8080, ge=0, description="Port of /healthz (0: off).")
    metrics_port: int = Field(
        default=9464, ge=0, description="Port of the Prometheus /metrics endpoint (0: off)."
    )
    risk_interval_seconds: int = Field(
        default=300,
        ge=0,
        description="How often to estimate each measured model's time to an out-of-memory crash from "
        "the last hours of GPU memory, KV-cache usage and preemptions in Prometheus (status.oomRisk, "
        "condition OOMRisk); 0: never. Runs in the measuring timer, so it needs LOADLINE_PROMETHEUS_URL.",
    )
    maintenance_interval_seconds: int = Field(
        default=30,
        ge=1,
        description="How often a model with a pending or running restart (status.maintenance) is looked "
        "at: whether its scheduled time has come, and the next step of a running restart.",
    )
    restart_window_minutes: int = Field(
        default=120,
        ge=1,
        le=1440,
        description="Length of the low-traffic window a restart is scheduled in (long enough to restart "
        "every pod of a model one at a time).",
    )
    restart_timezone: str = Field(
        default="UTC",
        min_length=1,
        description="IANA time zone in which traffic days are learned and windows are reported, e.g. "
        "Europe/Berlin (FleetPolicy windows carry their own).",
    )
    window_history_days: int = Field(
        default=28,
        ge=1,
        le=90,
        description="Days of request history read from Prometheus to learn each model's quiet window.",
    )
    window_refresh_seconds: int = Field(
        default=3600,
        ge=1,
        description="How long a learned window is reused before the history is read again.",
    )
    webhook_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port of the HTTPS admission webhooks (FleetPolicy defaults and limits), served by "
        "every replica; 0: none served.",
    )
    webhook_cert_dir: Path = Field(
        default=Path("/etc/loadline/webhook"),
        description="Directory with the serving certificate (tls.crt, tls.key): the mounted Secret.",
    )
    webhook_cert_check_seconds: float = Field(
        default=10,
        gt=0,
        description="How often the certificate files are re-read; a renewed one is served without a restart.",
    )
    image_registries: str = Field(
        default="",
        description="Comma-separated image prefixes InferenceModels may use beside vLLM's own registries "
        "(docker.io/vllm/, public.ecr.aws/q9t5s3a7/), e.g. registry.example.com/mirror/; * allows any "
        "image. Refused otherwise, with or without a FleetPolicy (docs/policies.md, threat model).",
    )
    allowed_env: str = Field(
        default="",
        description="Comma-separated environment names (NAME or PREFIX*) InferenceModels may set in "
        "spec.engine.env although they change how code is loaded (LD_*, PYTHONPATH, ...: refused by "
        "default).",
    )
    denied_env: str = Field(
        default="",
        description="Comma-separated environment names (NAME or PREFIX*) refused in spec.engine.env "
        "beside the built-in list.",
    )
    upgrade_roll: RollMode = Field(
        default="window",
        description="When pods a new loadline version renders differently roll (docs/upgrades.md): window "
        "(in each model's restart window, under FleetPolicy maxConcurrent), immediate (at once), manual "
        "(only once approved by the upgrade.loadline.dev/approve annotation). Urgent fixes roll at once.",
    )
    remediation_mode: str = Field(
        default="auto", pattern="^(auto|recommend|off)$", description="Default OOM remediation mode."
    )
    remediation_max_actions_per_day: int = Field(default=3, ge=0, description="Changes per model per day.")
    remediation_cooldown_minutes: int = Field(
        default=30, ge=0, description="Never undo a change within this."
    )
    remediation_min_confidence: float = Field(default=0.6, ge=0, le=1, description="Act only above this.")
    remediation_max_memory_gib: float = Field(default=1024, gt=0, description="Cap on raised pod memory.")
    rollouts_at_once: int = Field(
        default=0,
        ge=0,
        description="Crash remediations rolling out at once in this replica; more wait their turn, in "
        "order of spec.priority and of what they serve (0: no limit).",
    )
    rollouts_per_pool: int = Field(
        default=0,
        ge=0,
        description="Of those, at most this many on one GPU type (0: no limit).",
    )
    remediation_outcome_horizon_minutes: int = Field(
        default=1440,
        gt=0,
        description="An applied fix counts as having worked when its class does not come back within this.",
    )

    @field_validator("restart_timezone")
    @classmethod
    def _iana(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}: use an IANA name such as UTC or Europe/Berlin"
            ) from None
        return value

    @model_validator(mode="after")
    def _election_timings(self) -> Self:
        # The order client-go enforces: the leader gives up (renew deadline) before a standby may take
        # over (lease duration), with at least one retry inside the deadline; else two replicas could
        # reconcile at once, or a single slow renewal would cost the lease.
        ordered = self.lease_duration_seconds > self.renew_deadline_seconds > self.retry_period_seconds
        if (self.leader_election or self.shards > 1) and not ordered:
            raise ValueError(
                "leader election needs LOADLINE_LEASE_DURATION_SECONDS > LOADLINE_RENEW_DEADLINE_SECONDS > "
                f"LOADLINE_RETRY_PERIOD_SECONDS, got {self.lease_duration_seconds} > "
                f"{self.renew_deadline_seconds} > {self.retry_period_seconds}"
            )
        return self

    def guard(self) -> Guard:
        """The safe defaults these settings make (see :class:`loadline.policy.Guard`)."""
        return Guard.from_text(self.image_registries, self.allowed_env, self.denied_env)

    @property
    def namespace_list(self) -> list[str]:
        return [item.strip() for item in self.namespaces.split(",") if item.strip()]

    @property
    def api_connections(self) -> int:
        """Connections the Kubernetes client keeps: one per thread that may call the API server at once
        (kopf's pool, the models and crashes lanes, the readiness lane: loadline.lanes) and a
        few spare; with fewer, threads queue for a connection ("Connection pool is full")."""
        return self.max_workers * 3 + max(1, self.max_workers // 4) + 4

    def resolved_lease_namespace(self) -> str:
        """The Lease's namespace: the setting, else env POD_NAMESPACE (the chart sets it from the
        downward API), else the namespace the pod's service account token was issued in.

        Raises :class:`~loadline.errors.SpecError` when none is known (a local run without
        LOADLINE_LEASE_NAMESPACE): guessing ``default`` would let two installs elect across each other."""
        for candidate in (self.lease_namespace, os.environ.get("POD_NAMESPACE", "")):
            if candidate.strip():
                return candidate.strip()
        try:
            from_file = SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip()
        except OSError:
            from_file = ""
        if from_file:
            return from_file
        raise SpecError(
            "LOADLINE_LEASE_NAMESPACE",
            "no namespace for the leader-election Lease (not set, no POD_NAMESPACE, not in a pod)",
            "set LOADLINE_LEASE_NAMESPACE, or LOADLINE_LEADER_ELECTION=false for a single replica",
        )

    def resolved_identity(self) -> str:
        """This replica's ``holderIdentity``: the setting verbatim, else env POD_NAME (what
        ``kubectl get lease`` readers recognise) or the hostname, each with a suffix drawn once per
        process. The suffix is what client-go does too: a container restarted in the same pod is a new
        candidate, so it cannot mistake the Lease its crashed predecessor held for its own and resume
        leading before the standby had its fair chance."""
        if self.identity.strip():
            return self.identity.strip()
        base = os.environ.get("POD_NAME", "").strip() or socket.gethostname() or "loadline"
        return f"{base}_{_PROCESS_SUFFIX}"
