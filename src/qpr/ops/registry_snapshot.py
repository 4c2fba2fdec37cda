"""What a retraining run may change in the model registry, saved before the run and put
back when the run is rolled back: the aliases and every version's tags (promotion events
are tags), and which versions existed.

The run's journal keeps the snapshot as plain JSON; this module is the MLflow side of it.
A thin adapter like qpr.ops.registry: the registry API needs MlflowClient calls that the
registry module does not offer (delete a version, put a tag back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode
from mlflow.tracking import MlflowClient

from qpr.ops.registry import TAG_DATA_HASH, TAG_RETRAIN_RUN


def snapshot_registry(name: str) -> dict[str, Any]:
    """Aliases and every version's tags of model `name`: what a rollback must put back."""
    client = MlflowClient()
    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        if not _missing(exc):
            raise  # an unreachable server is not an empty registry
        return {"name": name, "exists": False, "aliases": {}, "versions": {}}
    versions = client.search_model_versions(f"name = '{name}'")
    return {
        "name": name,
        "exists": True,
        "aliases": {alias: str(v) for alias, v in (model.aliases or {}).items()},
        "versions": {str(v.version): dict(v.tags or {}) for v in versions},
    }


def restore_registry(journal: Mapping[str, Any]) -> list[str]:
    """Undo what a rolled-back run did to the registry: delete the versions it registered,
    put the aliases back, and restore every older version's tags (promotion events).

    "Registered by that run": tagged with its run (qpr.retrain_run), or created after the
    run began and trained on the data it made (the version's qpr.data_hash is the run's
    new data hash, or missing). Before
    the data was versioned (no data_md5 in the journal) the run cannot have registered
    anything, so nothing is deleted."""
    snapshot = journal.get("registry") or {}
    name = snapshot.get("name")
    if not name:
        return []
    client = MlflowClient()
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if not _missing(exc):
            # The tracking server is down (team mode): the rollback fails and the journal
            # stays, so the next run puts the registry back instead of calling it unchanged.
            raise
        return []
    steps = _restore_versions(client, name, snapshot, journal)
    steps += _restore_aliases(client, name, snapshot.get("aliases") or {})
    if not snapshot.get("exists") and not client.search_model_versions(f"name = '{name}'"):
        client.delete_registered_model(name)
        steps.append(f"registry: model {name!r} removed (it did not exist before)")
    return steps or ["registry: unchanged"]


def _missing(exc: MlflowException) -> bool:
    return exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST)


def _restore_versions(
    client: MlflowClient, name: str, snapshot: Mapping[str, Any], journal: Mapping[str, Any]
) -> list[str]:
    """Older versions get their tags back; versions the run registered are deleted."""
    steps: list[str] = []
    before_versions: dict[str, dict[str, str]] = snapshot.get("versions") or {}
    md5 = journal.get("data_md5")
    started_ms = int(journal.get("started_ms", 0))
    for mv in client.search_model_versions(f"name = '{name}'"):
        version = str(mv.version)
        tags = dict(mv.tags or {})
        if version in before_versions:
            wanted = before_versions[version]
            for key, value in wanted.items():
                if tags.get(key) != value:
                    client.set_model_version_tag(name, version, key, value)
            for key in set(tags) - set(wanted):
                client.delete_model_version_tag(name, version, key)
            if tags != wanted:
                steps.append(f"registry: tags of version {version} restored")
            continue
        data_hash = tags.get(TAG_DATA_HASH)
        ours = md5 is not None and data_hash in (None, f"dvc:{md5}")
        tagged = bool(journal.get("run")) and tags.get(TAG_RETRAIN_RUN) == journal.get("run")
        if tagged or (ours and mv.creation_timestamp >= started_ms):
            client.delete_model_version(name, version)
            steps.append(f"registry: version {version} (registered by the run) deleted")
    return steps


def _restore_aliases(client: MlflowClient, name: str, wanted: Mapping[str, str]) -> list[str]:
    """The aliases as they were (read after the run's versions are gone)."""
    steps: list[str] = []
    current = dict(client.get_registered_model(name).aliases or {})
    for alias in set(current) - set(wanted):
        client.delete_registered_model_alias(name, alias)
        steps.append(f"registry: alias {alias} removed")
    for alias, version in wanted.items():
        if str(current.get(alias)) != version:
            client.set_registered_model_alias(name, alias, version)
            steps.append(f"registry: alias {alias} → version {version} again")
    return steps
