"""The operator's settings: one documented object, read from ``LOADLINE_*`` environment variables.

The Helm chart sets these as env on the operator Deployment; `loadline run` flags override them.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    peering_name: str = Field(default="loadline", description="Peering object shared by operator replicas.")
    standalone: bool = Field(
        default=False,
        description="Run without peering (one replica only, or tests); else one replica is active.",
    )
    priority: int = Field(default=0, description="Peering priority of this replica (highest active wins).")
    capacity_aware: bool = Field(
        default=True,
        description="Plan with the cluster's free GPUs (fall back to the next GPU type when full).",
    )
    prometheus_url: str = Field(
        default="",
        description="Prometheus to read vLLM metrics from just before a crash (e.g. http://prometheus:9090).",
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
    remediation_mode: str = Field(
        default="auto", pattern="^(auto|recommend|off)$", description="Default OOM remediation mode."
    )
    remediation_max_actions_per_day: int = Field(default=3, ge=0, description="Changes per model per day.")
    remediation_cooldown_minutes: int = Field(
        default=30, ge=0, description="Never undo a change within this."
    )
    remediation_min_confidence: float = Field(default=0.6, ge=0, le=1, description="Act only above this.")
    remediation_max_memory_gib: float = Field(default=1024, gt=0, description="Cap on raised pod memory.")

    @property
    def namespace_list(self) -> list[str]:
        return [item.strip() for item in self.namespaces.split(",") if item.strip()]
