"""The coverage report's section on higher-order ops (the rest is checked against the sweep in
test_opinfo_sweep.py and through the command line in test_cli.py)."""
from torch_stablehlo.tools.coverage import higher_order_markdown, higher_order_ops


def test_higher_order_ops_name_their_lowering():
    rows = {row["op"]: row for row in higher_order_ops()}
    for op, form in (("cond", "stablehlo.if"), ("while_loop", "stablehlo.while"), ("scan", "stablehlo.while"),
                     ("map_impl", "stablehlo.while"), ("wrap_with_autocast", "inline")):
        assert rows[op]["lowering"] and form in rows[op]["becomes"], rows[op]
    assert rows["print"] == {"op": "print", "lowering": False, "becomes": ""}


def test_the_markdown_section_has_one_row_per_op():
    rows = higher_order_ops()
    lines = higher_order_markdown(rows)
    assert lines[1] == f"## Higher-order ops ({sum(r['lowering'] for r in rows)} of {len(rows)} lowered)"
    assert "| `cond` | yes | `stablehlo.if` whose branches" in "\n".join(lines)
    assert len([line for line in lines if line.startswith("| `")]) == len(rows)
