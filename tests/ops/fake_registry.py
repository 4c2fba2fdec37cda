"""An in-memory stand-in for qpr.ops.registry's MLflow calls: what the register stage and
the retraining cycle do to the registry, without a tracking server or a real bundle."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from qpr.ops import promotion, registry


class FakeRegistry:
    """Versions with tags and aliases; `calls` lists what was done, in order."""

    def __init__(self) -> None:
        self.versions: dict[int, dict[str, str]] = {}
        self.aliases: dict[str, int] = {}
        self.calls: list[tuple[str, int]] = []

    # ---- what tests set up
    def add(self, tags: dict[str, str], *, alias: str | None = None) -> int:
        version = len(self.versions) + 1
        self.versions[version] = dict(tags)
        if alias:
            self.aliases[alias] = version
        return version

    # ---- the registry API the code under test calls
    def get_version(self, name: str, version: int | str) -> registry.VersionInfo:
        v = int(version)
        tags = self.versions[v]
        return registry.VersionInfo(
            name=name,
            version=v,
            aliases=tuple(sorted(a for a, n in self.aliases.items() if n == v)),
            metric=tags.get(registry.TAG_METRIC),
            value=float(tags[registry.TAG_METRIC_VALUE])
            if registry.TAG_METRIC_VALUE in tags
            else None,
            created=datetime.now(UTC),
            run_id=None,
            tags=dict(tags),
        )

    def list_versions(self, name: str) -> list[registry.VersionInfo]:
        return [self.get_version(name, v) for v in sorted(self.versions, reverse=True)]

    def champion(self, name: str) -> registry.VersionInfo | None:
        v = self.aliases.get(registry.CHAMPION)
        return None if v is None else self.get_version(name, v)

    def register_bundle(
        self, models_dir: Path, metrics: dict, *, name: str, metric: str, tags: dict, **kw: Any
    ) -> registry.VersionInfo:
        value = promotion.metric_value(metrics, metric)
        version = self.add(
            {registry.TAG_METRIC: metric, registry.TAG_METRIC_VALUE: repr(value), **tags}
        )
        self.calls.append(("register", version))
        if registry.TAG_RETRAIN_RUN not in tags:
            self.aliases[registry.CHALLENGER] = version
            self.calls.append(("alias challenger", version))
        return self.get_version(name, version)

    def mark_committed(self, name: str, version: int | str, *, by: str) -> bool:
        if self.versions[int(version)].get(registry.TAG_COMMITTED):
            return False
        self.versions[int(version)][registry.TAG_COMMITTED] = by
        self.calls.append(("committed", int(version)))
        return True

    def promote(self, name: str, version: int | str, *, reason: str, actor: str, **kw):
        info = self.get_version(name, version)
        refusal = promotion.promotion_refusal(info, self.champion(name))
        if refusal and not kw.get("force"):
            raise registry.RegistryError(refusal)
        self.aliases[registry.CHAMPION] = int(version)
        self.calls.append(("alias champion", int(version)))
        return self.get_version(name, version)

    def keep_challenger(self, name: str, version: int, *, reason: str, actor: str):
        event = {"seq": 1, "action": "kept_challenger", "actor": actor, "reason": reason}
        self.versions[int(version)][f"{promotion.EVENT_PREFIX}001"] = json.dumps(event)
        self.calls.append(("kept", int(version)))
        return self.get_version(name, version)

    def set_challenger(self, name: str, version: int | str) -> None:
        self.aliases[registry.CHALLENGER] = int(version)
        self.calls.append(("alias challenger", int(version)))

    def describe(self, info: registry.VersionInfo) -> str:
        return f"v{info.version}"

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeRegistry:
        for name in (
            "get_version",
            "list_versions",
            "champion",
            "register_bundle",
            "mark_committed",
            "promote",
            "keep_challenger",
            "set_challenger",
            "describe",
        ):
            monkeypatch.setattr(registry, name, getattr(self, name))
        return self
