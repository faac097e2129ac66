"""Config sections that parts declare beside their class: a probe's or a sink's `PART` names a dataclass of
`setting()` fields (`section=`), read at the top of a monitor_config under the part's name, checked by the same
walker as the built-in sections, and handed to the part as `config.section(name)`. The registry lists them
(`registry.part_sections()`, the built-ins' from core/builtin_parts.SECTIONS); a section's class is imported only
where a configuration names its key or its part reads it, so reading a config imports no part it does not use."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from ms_exporter.core import registry


def names() -> tuple[str, ...]:
    """The top-level keys the parts' own sections are read under, in registration order."""
    return tuple(registry.part_sections())


def section_class(key: str) -> type:
    """The section class of the part named `key` (ImportError where its module cannot be imported)."""
    loaded: type = registry.load_named(registry.part_sections()[key])
    return loaded


def split(raw: Mapping[str, Any], built_in: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A config's raw mapping as (the parts' sections in it, the rest): a built-in key stays the built-in's, which
    a registered part cannot take over (the loader names such a part)."""
    own = set(names()) - set(built_in)
    return {k: v for k, v in raw.items() if k in own}, {k: v for k, v in raw.items() if k not in own}


def merged(before: Any, after: Any) -> Any:
    """A later source's value of a part's section: the sub-keys it names replace those given before."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        return {**before, **after}
    return after


def attach(config: Any, sections: Mapping[str, Any]) -> None:
    """Hands the checked sections to the (frozen) config, which serves them from `section()`."""
    object.__setattr__(config, "_part_sections", types.MappingProxyType(dict(sections)))


def given(config: Any) -> Mapping[str, Any]:
    """The parts' sections a config was given (a part's section it was not given is its defaults)."""
    sections: Mapping[str, Any] = config.__dict__.get("_part_sections", types.MappingProxyType({}))
    return sections
