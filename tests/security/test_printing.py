"""Terminal-safe printing: a bundle's strings (input names, versions, targets) reach a terminal with their control
characters escaped, in ``inspect``'s report, ``Signature.__str__`` and error messages, so a received bundle cannot
rewrite or hide lines of the report that vets it."""
import json

import pytest

from torch_stablehlo.exporter import BundleError, load_artifact
from torch_stablehlo.exporter.formats.manifest_schema import signature_from_json
from torch_stablehlo.exporter.terminal import printable
from torch_stablehlo.tools import cli

from .bundles import edit_manifest, read_manifest

HOSTILE = "x\x1b[2K\x1b[1A\rall checks passed\x07\u202e"


def _hostile(manifest):
    manifest["signature"]["inputs"][-1]["tensor"]["name"] = HOSTILE
    manifest["signature"]["inputs"][-1]["name"] = HOSTILE
    manifest["producer_version"] = manifest["stablehlo_target"] = HOSTILE


def _unsafe(text: str) -> list[str]:
    return [c for c in text if not c.isprintable() and c != "\n"]


def test_printable_escapes_what_a_terminal_would_act_on():
    assert printable(HOSTILE) == "x\\x1b[2K\\x1b[1A\\rall checks passed\\x07\\u202e"
    assert printable("plain: float32[2, 3]") == "plain: float32[2, 3]"


@pytest.mark.parametrize("as_json", [False, True])
def test_inspect_prints_a_bundles_strings_escaped(saved, capsys, as_json):
    edit_manifest(saved, _hostile)
    assert cli.main(["inspect", str(saved)] + (["--json"] if as_json else [])) == 0
    out = capsys.readouterr().out
    assert _unsafe(out) == [] and "all checks passed" in out
    if not as_json:
        assert "  producer_version: x\\x1b[2K\\x1b[1A\\rall checks passed\\x07\\u202e" in out.splitlines()
    else:
        assert json.loads(out)["versions"]["stablehlo_target"] == HOSTILE  # JSON escapes, its reader gets them back


def test_a_signature_prints_escaped(saved):
    edit_manifest(saved, _hostile)
    text = str(signature_from_json(read_manifest(saved)["signature"]))
    assert _unsafe(text) == [] and "  x\\x1b[2K" in text


def test_error_messages_quoting_a_bundle_are_escaped(saved, capsys):
    edit_manifest(saved, lambda m: m.__setitem__("format", HOSTILE))
    with pytest.raises(BundleError) as caught:
        load_artifact(saved)
    assert _unsafe(str(caught.value)) == [] and "all checks passed" in str(caught.value)
    assert cli.main(["inspect", str(saved)]) == 1
    assert _unsafe(capsys.readouterr().err) == []
