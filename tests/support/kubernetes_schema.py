"""Offline schema checks of Kubernetes objects: Kubernetes' own schemas and prometheus-operator's CRDs."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from cloudcoil.models.prometheus_operator import v1 as monitoring_v1

KUBERNETES_VERSION = "1.30.0"


def schema_problems(obj: dict[str, Any]) -> list[str]:
    """What the schema of obj's kind rejects in obj; empty when it passes."""
    group = obj.get("apiVersion", "").split("/")[0]
    if group == "monitoring.coreos.com":
        model = getattr(monitoring_v1, obj["kind"])
        try:
            parsed = model.model_validate(obj)
        except Exception as exc:  # pydantic's ValidationError lists every field that failed
            return [str(exc)]
        return [
            f"unknown field {path}"
            for path in _dropped(obj, parsed.model_dump(by_alias=True, exclude_unset=True, mode="json"))
        ]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [exc.message]
    return []


def _dropped(given: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        return [
            p
            for key, value in given.items()
            for p in ([f"{path}.{key}"] if key not in kept else _dropped(value, kept[key], f"{path}.{key}"))
        ]
    if isinstance(given, list) and isinstance(kept, list):
        lost = [f"{path}[{i}]" for i in range(len(kept), len(given))]
        pairs = enumerate(zip(given, kept))
        return lost + [p for i, (a, b) in pairs for p in _dropped(a, b, f"{path}[{i}]")]
    return []
