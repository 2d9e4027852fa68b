"""The report's causes table (graphdoctor/report/html_causes.py): names wrap only between their parts, paths are
shortened for display with the recorded one kept, and one line's causes across layers fold into one row."""

from __future__ import annotations

from graphdoctor.compare.cause import Cause
from graphdoctor.report.html_causes import breakable, display_path, fold_causes, spans


def _cause(module: str, rule: str = "GD518", location: str | None = "/w/m.py:27", explains: bool = False) -> Cause:
    return Cause(rule=rule, name="n", severity="warning", module=module, location=location, message="evidence",
                     fix="fix", explains=explains)


def test_names_break_between_parts_never_inside_a_number_or_a_file_name() -> None:
    assert breakable("optimizer.grad_scaler._scale") == "optimizer.<wbr>grad_scaler.<wbr>_scale"
    assert breakable("max rel 0.122") == "max rel 0.122"
    assert breakable("/site/megatron/core/grad_scaler.py:143", path=True) == \
        "/site/<wbr>megatron/<wbr>core/<wbr>grad_scaler.py:143"
    assert "<wbr>" in breakable("a_very_long_snake_case_file_name_here.py", path=True)  # past MAX_PART_CHARS
    assert breakable("a<b") == "a&lt;b"


def test_installed_paths_show_from_the_package_and_absolute_ones_their_tail() -> None:
    shown = display_path("/opt/venv/lib/python3.12/site-packages/megatron/core/optimizer/grad_scaler.py:143")
    assert shown == "megatron/core/optimizer/grad_scaler.py:143"
    assert display_path("/work/main/fixtures/planted/holders/cases.py:104") == "\u2026/planted/holders/cases.py:104"
    assert display_path("cases.py:104") == "cases.py:104"


def test_one_lines_causes_across_layers_fold_into_one_row_with_the_explaining_one_first() -> None:
    causes = [_cause("decoder.layers.0.mlp"), _cause("decoder.layers.1.mlp", explains=True),
              _cause("decoder.layers.3.mlp"), _cause("decoder.layers.2.mlp", rule="GD509"),
              _cause("optimizer.grad_scaler._scale", rule="GD522", location=None)]
    rows = fold_causes(causes)
    assert [(r.rule, r.module, r.layers, r.explains) for r in rows] == [
        ("GD518", "decoder.layers.*.mlp", (0, 1, 3), True),
        ("GD509", "decoder.layers.2.mlp", (), False),
        ("GD522", "optimizer.grad_scaler._scale", (), False)]
    assert spans(rows[0].layers) == "0-1, 3"


def test_one_layer_seen_twice_at_one_line_stays_two_rows() -> None:
    rows = fold_causes([_cause("decoder.layers.0.mlp"), _cause("decoder.layers.0.mlp")])
    assert [r.layers for r in rows] == [(), ()]
