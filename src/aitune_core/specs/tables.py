"""Rich tables for specs (columns: Locator, Name, Shape, Min Shape, Max Shape, Dtype).

Rendering is for logs and `print`; nothing on a dispatch path calls into this module. The spec types
(`GraphSpec`, `SampleMetadata`) hold data only and never import this module: drawing depends on the data, not
the other way round. `render_graph_spec(spec)` is the logged text; `graph_spec_renderable(spec)` goes to
`rich.print`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from aitune_core.log import render_to_str
from aitune_core.specs.replay_state import describe_replay_state

if TYPE_CHECKING:
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.specs.sample_metadata import SampleMetadata

TENSOR_COLUMNS = ("Locator", "Name", "Shape", "Min Shape", "Max Shape", "Dtype")
CONSTANT_COLUMNS = ("Locator", "Value")

# ╒═╤═╕ / ╞═╪═╡ / ╘═╧═╛ borders, as in every aitune spec table
SPEC_BOX = box.Box(
    "╒═╤╕\n"
    "│ ││\n"
    "╞═╪╡\n"
    "│ ││\n"
    "├─┼┤\n"
    "├─┼┤\n"
    "│ ││\n"
    "╘═╧╛\n"
)


def _shape_text(shape: Any) -> str:
    return str(list(shape))


def tensor_table(metadata: SampleMetadata) -> Table:
    table = Table(*TENSOR_COLUMNS, box=SPEC_BOX, header_style="none", show_lines=False)
    for spec in metadata.tensors:
        table.add_row(
            spec.locator,
            spec.name,
            _shape_text(spec.shape),
            _shape_text(spec.min_shape),
            _shape_text(spec.max_shape),
            str(spec.dtype),
        )
    return table


def constant_table(metadata: SampleMetadata) -> Table:
    table = Table(*CONSTANT_COLUMNS, box=SPEC_BOX, header_style="none")
    for locator, value in metadata.constants:
        text = repr(value)
        table.add_row(locator, text if len(text) <= 80 else text[:77] + "...")
    return table


def sample_metadata_renderable(metadata: SampleMetadata) -> Group:
    parts: list[Any] = [Text("Tensors:"), tensor_table(metadata)]
    if metadata.constants:
        parts += [Text("Constants:"), constant_table(metadata)]
    return Group(*parts)


def graph_spec_renderable(graph_spec: GraphSpec) -> Group:
    state = describe_replay_state(graph_spec)
    return Group(
        Text(f"Name={graph_spec.name}" + (f" ({state})" if state else "")),
        Text("Input_spec:"),
        sample_metadata_renderable(graph_spec.input_spec),
        Text("Output_spec:"),
        sample_metadata_renderable(graph_spec.output_spec),
    )


def render_sample_metadata(metadata: SampleMetadata) -> str:
    return render_to_str(sample_metadata_renderable(metadata))


def render_graph_spec(graph_spec: GraphSpec) -> str:
    return render_to_str(graph_spec_renderable(graph_spec))
