"""The config file read strictly: YAML with no aliases and no key given twice, its top level a mapping.

Apart from config.py, which gives the values their meaning, because what YAML may hold is a concern of its own:
a few hundred bytes of aliases expand to gigabytes, and a second `max_dph` would quietly win.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vastctl import validate
from vastctl.errors import BadInput


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml  # only when there is a file to read

    try:
        data = _load_strict(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"config file {path} cannot be read: {exc}") from exc
    except _Refused as exc:
        raise BadInput(f"config file {path} {exc}") from exc
    except RecursionError as exc:
        raise BadInput(f"config file {path} is nested too deeply to be a vastctl config") from exc
    except yaml.YAMLError as exc:
        raise BadInput(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from exc
    except ValueError as exc:  # PyYAML building a value Python refuses, e.g. an integer of 5,000 digits
        raise BadInput(f"config file {path} holds a value no setting can take ({validate.shown(str(exc))}):"
                       " fix the number") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"config file {path}: the top level must be a mapping of keys")
    return data


class _Refused(Exception):
    """Valid YAML that a config may not use (an alias, a key given twice); the text says where."""


def _load_strict(text: str) -> Any:
    """yaml.safe_load without aliases (a few hundred bytes of them expand to gigabytes) and without duplicate keys
    (YAML keeps the last one silently, so a second `max_dph` would quietly win)."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            if self.check_event(yaml.AliasEvent):
                # types-PyYAML leaves Parser.peek_event unannotated (unused-ignore: the non-strict run allows the call)
                event = self.peek_event()  # type: ignore[no-untyped-call, unused-ignore]
                raise _Refused(f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not allowed:"
                               " write the value out")
            return super().compose_node(parent, index)

    loader = NoAliasLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, "")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(node: Any, prefix: str) -> None:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{prefix.rstrip('.')}[{index}].")
    if not isinstance(node, yaml.MappingNode):
        return
    first_line: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        name = f"{prefix}{key}"
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise _Refused(f"line {line}: key {name!r} appears twice (first on line {first_line[key]}): keep one")
        if key is not None:
            first_line[key] = line
        _refuse_duplicate_keys(value_node, f"{name}.")
