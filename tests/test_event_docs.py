"""docs/events.md is the export format's contract: it must name every event type."""

from __future__ import annotations

import re
from pathlib import Path

from fleetledger.events.models import EVENT_TYPES, FleetConfig

DOC = (Path(__file__).resolve().parents[1] / "docs" / "events.md").read_text(encoding="utf-8")


def test_every_event_type_and_its_fields_are_documented() -> None:
    for type_, cls in EVENT_TYPES.items():
        row = re.search(rf"^\| `{type_}` \|(.*)$", DOC, flags=re.MULTILINE)
        assert row, f"docs/events.md has no table row for {type_!r}"
        for field in cls.model_fields:
            if field not in ("id", "type"):
                assert f"`{field}`" in row.group(1), f"{type_}: field {field!r} undocumented"


def test_every_fleet_config_field_is_documented() -> None:
    for field in FleetConfig.model_fields:
        assert f"`{field}`" in DOC, f"FleetConfig.{field} is not documented"


def test_the_documented_line_keys_are_the_export_keys() -> None:
    from fleetledger.events.jsonl import LINE_KEYS

    for key in LINE_KEYS:
        assert f"| `{key}` |" in DOC, f"export key {key!r} is not documented"
