"""What a module or a bundle holds: op histogram, signature (with the mesh and each tensor's sharding),
versions, weight sizes, the composites and the user's JAX lowerings it uses."""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

from torch_stablehlo.aten_lowerings import USER_FUNCTIONS
from torch_stablehlo.stablehlo_ir.op_counts import op_histogram

from torch_stablehlo.exporter.formats import bundle
from torch_stablehlo.exporter.formats.manifest_schema import signature_from_json
from torch_stablehlo.exporter.terminal import printable

VERSION_KEYS = ("format_version", "stablehlo_version", "stablehlo_target", "producer", "producer_version",
                "torch_version", "jaxlib_version")


def bundle_report(path: str | os.PathLike, top: int = 10) -> dict:
    """Versions, signature, op histogram and weight sizes of a bundle (its weights are not read)."""
    path = Path(path)
    manifest, text, _ = bundle.inspect_bundle(path)
    histogram = op_histogram(text)
    weights = manifest["weights"]
    largest = sorted(weights, key=lambda name: weights[name]["bytes"], reverse=True)[:top]
    return {
        "path": str(path),
        "versions": {key: manifest.get(key) for key in VERSION_KEYS},
        "signature": manifest["signature"],
        "mesh": manifest.get("mesh"),
        "platforms": manifest["signature"].get("platforms", []),
        "ops": dict(histogram.most_common()),
        **extensions_used(text),
        "weights": {"count": len(weights), "aliases": len(manifest["weight_aliases"]),
                    "bytes": sum(record["bytes"] for record in weights.values()),
                    "largest": [{"name": name, **weights[name]} for name in largest]},
        "files": manifest["files"],
    }


COMPOSITE = re.compile(r'stablehlo\.composite "([^"]+)"')


def extensions_used(text: str) -> dict:
    """``composites``: how many calls of each composite the module holds (name -> count); ``user_lowerings``: the
    ops lowered by a user's JAX function (``exporter.lowering``; op, dots as underscores -> its functions)."""
    functions = Counter(match[1] for match in re.finditer(r"func\.func private @" + USER_FUNCTIONS.pattern + r"\(",
                                                          text))
    return {"composites": dict(Counter(COMPOSITE.findall(text)).most_common()), "user_lowerings": dict(functions)}


def format_report(report: dict) -> str:
    """The report as text for a terminal: every line terminal-safe (``printable``: a bundle's names and versions
    cannot rewrite or hide lines of the report that vets it)."""
    lines = [f"bundle {report['path']}", "versions:"]
    lines += [f"  {key}: {value}" for key, value in report["versions"].items()]
    lines += str(signature_from_json(report["signature"])).splitlines()
    ops = report["ops"]
    lines.append(f"ops: {sum(ops.values())} ({len(ops)} kinds)")
    lines += [f"  {count:6d}  {name}" for name, count in ops.items()]
    for key, title in (("composites", "composites"), ("user_lowerings", "user JAX lowerings (functions)")):
        if report[key]:
            lines.append(f"{title}:")
            lines += [f"  {count:6d}  {name}" for name, count in report[key].items()]
    weights = report["weights"]
    lines.append(f"weights: {weights['count']} stored ({weights['aliases']} aliases), {human_size(weights['bytes'])}")
    lines += [f"  {human_size(w['bytes']):>10}  {w['name']}  {w['dtype']}{w['shape']}" for w in weights["largest"]]
    lines.append("files:")
    lines += [f"  {human_size(record['bytes']):>10}  {name}" for name, record in report["files"].items()]
    return "\n".join(printable(line) for line in lines)


def human_size(count: int) -> str:
    """``512 B``, ``1.5 MB``, ``2.1 GB`` (powers of 1000)."""
    value, unit = float(count), "B"
    for bigger in ("KB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
