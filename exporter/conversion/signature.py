"""The artifact's calling convention: what ``@main`` takes and returns, and the pytrees around it."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Sequence

import sympy
import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from torch_stablehlo.aten_lowerings import RNG_SEED_DTYPE, RNG_SEED_NAME, call_time_sizes, uses_random
from torch_stablehlo.exported_program import (HELD_KINDS, INPUT_KINDS, OUTPUT_KINDS, STATE, STATE_UPDATE,
                                              USER_INPUT, USER_OUTPUT, WEIGHT_KINDS)
from torch_stablehlo.stablehlo_ir.dtypes import PYTHON_SCALAR_DTYPES, scalar_type
from torch_stablehlo.stablehlo_ir.shardy import Spec
from torch_stablehlo.stablehlo_ir.specs import TensorSpec, dtype_name

from ..errors import ExportError
from . import symbolic_dims
from .signature_text import signature_text
from .trees import load_treespec


@dataclass(frozen=True)
class InputSlot:
    """One graph placeholder: a weight (``target`` = state-dict key) or a user input."""
    name: str
    kind: str                      # an exported_program kind ("parameter", "state", "user_input", ...), RNG_SEED
    target: str | None
    tensor: TensorSpec | None      # None for a non-tensor input that export specialised
    value: object = None           # that specialised value; a scalar input's symbol (its range is in ``dims``)
    sharding: Spec | None = None   # per dim, the mesh axes it is split over (None: left to XLA's propagation)
    # a keyword input a call may leave out, then ones of the shape and dtype of the user input named here
    # (a generate program's attention_mask, as model.generate defaults it); None: required
    ones_like: str | None = None
    scalar: str | None = None      # "int": a SymInt user input, a 0-d int64 in @main, given as a Python int


@dataclass(frozen=True)
class OutputSlot:
    """One output of the program: a result of ``@main`` (``tensor``) or a constant it returns (``value``)."""
    kind: str                      # "user_output" | "buffer_mutation" (a state slot's new value)
                                   # | "user_input_mutation"
    target: str | None             # the state slot's target (buffer_mutation), or the mutated user input's name
    tensor: TensorSpec | None      # None for a constant output (not among @main's results)
    scalar: str | None = None      # "int" | "float" | "bool": a SymInt/SymFloat/SymBool, a 0-d tensor in @main
    value: object = None           # a constant output's value

    def user_value(self, result):
        """The Python value the caller gets for this user output from its ``@main`` result (None for a constant)."""
        if self.tensor is None:
            return self.value
        return _SCALAR_TYPES[self.scalar](result.item()) if self.scalar else result


_SCALAR_TYPES = {python.__name__: python for python in PYTHON_SCALAR_DTYPES}  # as the manifest names them
SCALAR_NAMES = frozenset(_SCALAR_TYPES)


PLATFORM_INDEX = "platform_index"
"""The kind and name of ``@main``'s first argument where it is lowered for several platforms (never a slot of
``Signature.inputs``: ``main_inputs`` puts it first)."""
PLATFORM_INDEX_SLOT = InputSlot(PLATFORM_INDEX, PLATFORM_INDEX, None, TensorSpec(PLATFORM_INDEX, "int32", ()))

CALL_SIZE = "call_size"
"""The kind of ``@main``'s arguments that give a size read from tensor data with no bound (``.item()``), or one
that some op cannot take padded (``call_time_sizes``): one ``int8[u_above_0, u_below_0, 0]`` (no elements; ``u``
is dim 0 less dim 1, as a pad may be negative) per such size ``u``, after the user inputs; ``@main`` returns the
value its graph computes for each after everything else, and a call is run again with those until they agree
(``call_sizes``)."""

RNG_SEED = RNG_SEED_NAME
"""The kind and name of ``@main``'s last argument where the program draws random numbers: the seed."""
RNG_SEED_SLOT = InputSlot(RNG_SEED, RNG_SEED, None, TensorSpec(RNG_SEED, dtype_name(RNG_SEED_DTYPE), ()))


@dataclass(frozen=True)
class Signature:
    """``@main``'s calling convention: its arguments and results, the pytrees a call's inputs and outputs make
    around them, their symbolic dims, the mesh and the platforms it is lowered for. Fixed once made: the sequences
    given are held as tuples, and a changed convention is a new one (``dataclasses.replace``).

    Each question about the inputs has one member: by kind, ``weights``, ``state``, ``held_inputs`` (both, as
    ``@main`` takes them first), ``user_inputs``, ``call_sizes``; by position, ``main_inputs`` (``@main``'s
    arguments) and ``caller_inputs`` (those less the platform index). About the outputs: ``user_outputs``,
    ``main_outputs`` (``@main``'s results), ``state_results`` and ``call_size_results`` (positions among them).
    A call's checks are ``calls``', the text ``signature_text``'s, the JSON ``formats.manifest_schema``'s."""
    inputs: Sequence[InputSlot]
    outputs: Sequence[OutputSlot]
    in_spec: str                   # pytree spec of (args, kwargs), as torch's treespec_dumps
    out_spec: str
    dims: dict[str, list] = field(default_factory=dict)  # symbolic dim -> [min, max] (max None: unbounded)
    # data-dependent sizes (torch's u0, ...) of output dims: @main returns them, in this order, after its
    # outputs (as 0-d int64), and the outputs come back padded along those dims (see ``output_values``)
    sizes: Sequence[str] = ()
    mesh: dict[str, int] | None = None  # device mesh (axis -> size) @main is partitioned over; None: one device
    arg_names: Sequence[str] = ()  # forward's positional parameters, which calls may name
    # the platforms @main is lowered for, in the order its platform index counts them (see takes_platform_index);
    # none recorded in a bundle made before they were: lowered for one
    platforms: Sequence[str] = ()
    # (in_spec, out_spec) as TreeSpecs where this process exported the program: their exact types (the strings
    # above name tuple subclasses torch cannot serialise as plain tuples); None: read from the strings
    live_trees: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        for name in ("inputs", "outputs", "sizes", "arg_names", "platforms"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def weights(self) -> list[InputSlot]:
        """The parameters, buffers and lifted constants the program only reads (``WEIGHT_KINDS``): the artifact holds
        them."""
        return [s for s in self.inputs if s.kind in WEIGHT_KINDS]

    @property
    def state(self) -> list[InputSlot]:
        """The program's persistent state: the buffers and lifted constants it writes, carried from call to call."""
        return [s for s in self.inputs if s.kind == STATE]

    @property
    def state_results(self) -> set[int]:
        """The positions among ``@main``'s results of the state's new values (``buffer_mutation`` outputs)."""
        return {i for i, slot in enumerate(self.main_outputs) if slot.kind == STATE_UPDATE}

    @property
    def held_inputs(self) -> list[InputSlot]:
        """``@main``'s leading arguments, which the artifact holds: the weights and the state, in ``@main`` order."""
        return [s for s in self.inputs if s.kind in HELD_KINDS]

    @property
    def user_inputs(self) -> list[InputSlot]:
        """The inputs a call passes (``forward``'s), tensors or not, in placeholder order."""
        return [s for s in self.inputs if s.kind == USER_INPUT]

    @property
    def main_inputs(self) -> list[InputSlot]:
        """``@main``'s arguments, in order: the platform index where it takes one, the tensor inputs (weights and
        state, then user inputs), then ``rng_seed``."""
        return ([PLATFORM_INDEX_SLOT] if self.takes_platform_index else []) + self.caller_inputs

    @property
    def caller_inputs(self) -> list[InputSlot]:
        """``@main``'s arguments but the platform index, which whoever runs it passes for the platform it runs on
        (XlaCallModule, ``jax.export``, the artifact): those a caller gives."""
        return [s for s in self.inputs if s.tensor is not None]

    @property
    def takes_platform_index(self) -> bool:
        """Whether ``@main`` is lowered for several platforms: its first argument is then the platform index
        (a 0-d int32, the position in ``platforms`` of the one it runs on), as ``jax.export`` lowers it."""
        return len(self.platforms) > 1

    @property
    def main_shardings(self) -> list[Spec | None]:
        """Each ``@main`` argument's sharding (None: not given, left to XLA's propagation)."""
        return [s.sharding for s in self.main_inputs]

    @property
    def call_sizes(self) -> list[str]:
        """The sizes a call gives (``CALL_SIZE``), in ``@main``'s order."""
        return [s.value for s in self.inputs if s.kind == CALL_SIZE]

    @property
    def call_size_results(self) -> range:
        """The positions among ``@main``'s results of the values it computes for ``call_sizes``: after the outputs
        and their data-dependent sizes."""
        first = len(self.main_outputs) + len(self.sizes)
        return range(first, first + len(self.call_sizes))

    @property
    def takes_rng_seed(self) -> bool:
        """Whether ``@main`` ends with the ``rng_seed`` argument (the program draws random numbers)."""
        return any(s.kind == RNG_SEED for s in self.inputs)

    @property
    def user_outputs(self) -> list[OutputSlot]:
        """What ``forward`` returns, leaf by leaf (``out_tree``): ``@main``'s results and the constants."""
        return [s for s in self.outputs if s.kind == USER_OUTPUT]

    @property
    def main_outputs(self) -> list[OutputSlot]:
        """The outputs ``@main`` returns, in its order (constant outputs are not among them)."""
        return [s for s in self.outputs if s.tensor is not None]

    @property
    def is_dynamic(self) -> bool:
        """Whether any user input has a symbolic dim."""
        return any(isinstance(d, str) for s in self.user_inputs if s.tensor for d in s.tensor.shape)

    @functools.cached_property
    def in_tree(self) -> pytree.TreeSpec:
        """The pytree of ``(args, kwargs)`` a call takes."""
        return self.live_trees[0] if self.live_trees else load_treespec(self.in_spec)

    @functools.cached_property
    def out_tree(self) -> pytree.TreeSpec:
        """The pytree of the model's outputs."""
        return self.live_trees[1] if self.live_trees else load_treespec(self.out_spec)

    def __str__(self) -> str:
        return signature_text(self)


OUTPUT_SLOT_KINDS = frozenset(OUTPUT_KINDS.values())
INPUT_SLOT_KINDS = frozenset({kind.name for kind in INPUT_KINDS.values()} | {STATE, RNG_SEED, CALL_SIZE})
"""The kinds an input slot may have (a manifest's are checked against them)."""


def signature_of(ep: torch.export.ExportedProgram, kinds: Sequence[str | None]) -> Signature:
    """Read the calling convention of an ExportedProgram (inputs in placeholder order), given its inputs' kinds
    (``inplace.InPlaceWrites.kinds``: which are state depends on what its graph writes). A state slot the graph
    writes in place (not among torch's buffer mutations) gets a ``buffer_mutation`` output after the program's
    own: ``@main`` returns its value after the walk (``GraphLowering``)."""
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    call_signature = ep.module_call_graph[0].signature
    names = symbolic_dims.user_dim_names(ep)  # torch's s77 -> the user's Dim name, where torch kept it
    inputs = []
    for spec, kind in zip(ep.graph_signature.input_specs, kinds):
        if kind is None:
            raise NotImplementedError(f"input kind {spec.kind} ({spec.arg}) is not supported")
        meta = placeholders[spec.arg.name].meta.get("val")
        # user inputs are named by torch.export after forward's parameters ("input_ids", "x_0")
        name = spec.arg.name if kind == USER_INPUT else spec.target
        if is_symbolic_int(meta):  # an int input export left symbolic: a 0-d int64 argument of @main
            symbol = symbolic_dims.rename_dim(str(meta.node.expr), names)
            inputs.append(InputSlot(name, kind, spec.target, TensorSpec(name, "int64", ()), symbol, scalar="int"))
            continue
        tensor = TensorSpec.from_meta(name, meta) if isinstance(meta, torch.Tensor) else None
        value = None if tensor is not None else _plain(meta)
        inputs.append(InputSlot(name, kind, spec.target, tensor, value))
    inputs += _call_size_slots(ep, inputs)
    if uses_random(ep.graph_module):  # GraphLowering appends it to @main's arguments
        inputs.append(RNG_SEED_SLOT)
    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    outputs = []
    user_outputs = 0
    user_output_names = output_names(call_signature.out_spec)
    for spec, node in zip(ep.graph_signature.output_specs, output_node.args[0]):
        kind = OUTPUT_KINDS.get(spec.kind)
        name = user_output_names[user_outputs] if kind == USER_OUTPUT else spec.target
        if kind == USER_OUTPUT and not isinstance(node, torch.fx.Node):  # a constant forward returns
            outputs.append(OutputSlot(kind, None, None, value=_plain(node)))
            user_outputs += 1
            continue
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        python = scalar_type(meta) if kind == USER_OUTPUT else None
        scalar = python.__name__ if python else None
        if kind is None or not (isinstance(meta, torch.Tensor) or scalar):
            raise NotImplementedError(
                f"output {spec.arg} of kind {spec.kind} is not supported: outputs must be tensors, "
                "Python scalars or constants (return them, or pytrees of them, from forward)")
        user_outputs += kind == USER_OUTPUT
        tensor = (TensorSpec(name, dtype_name(PYTHON_SCALAR_DTYPES[python]), ()) if scalar
                  else TensorSpec.from_meta(name, meta))
        outputs.append(OutputSlot(kind, spec.target, tensor, scalar))
    returned = {s.target for s in outputs if s.kind == STATE_UPDATE}
    outputs += [OutputSlot(STATE_UPDATE, s.target, s.tensor) for s in inputs
                if s.kind == STATE and s.target not in returned]
    in_spec, out_spec = call_signature.in_spec, call_signature.out_spec
    if names:
        inputs = [dataclasses.replace(s, tensor=symbolic_dims.renamed_spec(s.tensor, names)) for s in inputs]
        outputs = [dataclasses.replace(s, tensor=symbolic_dims.renamed_spec(s.tensor, names)) for s in outputs]
    return Signature(inputs, outputs, _dumped(in_spec), _dumped(out_spec), _dim_ranges(ep),
                     data_dependent_sizes(n.meta.get("val") for n in output_node.args[0]
                                          if isinstance(n, torch.fx.Node)),
                     arg_names=list(call_signature.forward_arg_names or [])[:in_spec.child(0).num_children],
                     live_trees=(in_spec, out_spec))



def _call_size_slots(ep: torch.export.ExportedProgram, inputs: list[InputSlot]) -> list[InputSlot]:
    """A ``CALL_SIZE`` argument for each size read from data with no bound, or that some op cannot take padded
    (``call_time_sizes``). A call runs the program until the sizes it computes are those it was given: refused
    where that would draw random numbers or write state more than once (then only sizes with no bound are given,
    and an op that cannot take a padded one raises naming it)."""
    rerunnable = not (uses_random(ep.graph_module) or any(s.kind == STATE for s in inputs))
    symbols = [str(s) for s in call_time_sizes(ep.graph_module, rerunnable)]
    if symbols and not rerunnable:
        raise NotImplementedError(
            f"the sizes {', '.join(symbols)} are read from tensor data (.item(), bincount, repeat_interleave) with "
            "no upper bound, so a call runs the program until they are known, which a program that draws random "
            "numbers or writes state cannot do: bound them where they are made (torch._check(u <= N))")
    return [InputSlot(f"size_{symbol}", CALL_SIZE, None,
                      TensorSpec(f"size_{symbol}", "int8", (f"{symbol}_above_0", f"{symbol}_below_0", 0)), symbol)
            for symbol in symbols]


def is_symbolic_int(meta) -> bool:
    """A placeholder's value that is an int export kept symbolic (a SymInt over one symbol, not pinned)."""
    return isinstance(meta, torch.SymInt) and meta.node.maybe_as_int() is None \
        and isinstance(meta.node.expr, sympy.Symbol)


def output_names(out_spec: pytree.TreeSpec) -> list[str]:
    """A name for each output leaf of the model: its dict keys, ``ModelOutput`` fields and positions joined by
    dots (``logits``, ``pair.0``, namedtuple fields by name); a position in a returned tuple, or a lone tensor,
    is ``output_N``."""
    numbered = pytree.tree_unflatten(list(range(out_spec.num_leaves)), out_spec)
    return [_output_name(path) for path, _ in pytree.tree_flatten_with_path(numbered)[0]]


def _output_name(path) -> str:
    if not path:
        return "output_0"
    parts = [str(getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))) for key in path]
    if isinstance(path[0], pytree.SequenceKey):
        parts[0] = f"output_{parts[0]}"
    return ".".join(parts)


def data_dependent_sizes(metas) -> list[str]:
    """The data-dependent symbols (torch's ``u0``) among the dims of the tensor ``metas`` (one per @main output,
    in order), each once, in order of first appearance: the sizes @main returns after its outputs."""
    names: list[str] = []
    for meta in metas:
        if isinstance(meta, torch.Tensor):
            for size in meta.shape:
                if isinstance(size, torch.SymInt) and free_unbacked_symbols(size) and str(size.node.expr) not in names:
                    names.append(str(size.node.expr))
    return names


def _dim_ranges(ep: torch.export.ExportedProgram) -> dict[str, list]:
    """Each symbolic dim's [min, max] from the program's range constraints (max None when unbounded)."""
    def bound(value):  # torch's int_oo claims to be finite; only plain integers are bounds
        return int(value) if isinstance(value, (int, sympy.Integer)) else None

    names = symbolic_dims.user_dim_names(ep)
    return {symbolic_dims.rename_dim(str(symbol), names): [bound(r.lower), bound(r.upper)]
            for symbol, r in sorted(ep.range_constraints.items(), key=lambda item: str(item[0]))}


def _dumped(spec: pytree.TreeSpec) -> str:
    """The spec as text (``_serializable``): a type with no pytree serialization name (an ``nn.Module`` passed as
    an input, an unregistered dataclass, a ``register_constant`` class) as a plain tuple of its children, which
    this process's calls never read (they take ``live_trees``) and a bundle never holds (``unnamed_types``)."""
    return pytree.treespec_dumps(_serializable(spec))


def unnamed_types(signature: Signature) -> str | None:
    """Where the call's pytrees hold a type with no pytree serialization name (so its text, ``in_spec`` and
    ``out_spec``, cannot record it): that type, described with what to do; else None."""
    kinds = [t for spec in signature.live_trees or () for t in _types(spec) if not _recorded(t)]
    if not kinds:
        return None
    kind = kinds[0]
    module = " (an nn.Module: its weights are inputs of the program; make it an attribute of the model)" \
        if isinstance(kind, type) and issubclass(kind, torch.nn.Module) else ""
    return (f"{kind.__module__}.{kind.__qualname__}{module}, a type with no pytree serialization name: pass its "
            "tensors, or register the class with torch.export.register_dataclass(cls, serialized_type_name=...)")


def _types(spec: pytree.TreeSpec):
    if not spec.is_leaf():
        yield spec.type
        for child in spec.children():
            yield from _types(child)


def _recorded(kind) -> bool:
    """Whether a pytree node type survives ``_dumped``'s text (tuple subclasses become plain tuples)."""
    return kind is pytree.namedtuple or _has_serialized_name_of(kind) or (isinstance(kind, type)
                                                                          and issubclass(kind, tuple))


def _has_serialized_name_of(kind) -> bool:
    registered = pytree.SUPPORTED_SERIALIZED_TYPES.get(kind)
    return registered is not None and registered.serialized_type_name != "NO_SERIALIZED_TYPE_NAME_FOUND"


def _serializable(spec: pytree.TreeSpec) -> pytree.TreeSpec:
    """The spec with the types torch cannot serialise replaced by plain tuples: tuple subclasses
    (``torch.return_types.max``, unregistered namedtuples), which a loaded artifact returns as tuples, and the
    types ``unnamed_types`` names, which no bundle holds."""
    if spec.is_leaf():
        return spec
    children = [_serializable(child) for child in spec.children()]
    if not _has_serialized_name(spec):
        return pytree.TreeSpec(tuple, None, children)
    return pytree.TreeSpec(spec.type, spec.context, children)


def _has_serialized_name(spec: pytree.TreeSpec) -> bool:
    if spec.type is pytree.namedtuple:  # registered per class, with the class as context
        try:
            pytree._namedtuple_serialize(spec.context)
            return True
        except NotImplementedError:
            return False
    return _has_serialized_name_of(spec.type)


def _plain(value):
    """A constant input or output as the manifest records it: a Python value (a SymInt export pinned: its
    number), else its repr."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        pinned = value.node.maybe_as_int() if isinstance(value, torch.SymInt) else None
        value = pinned if pinned is not None else value
    return value if isinstance(value, (int, float, bool, str, type(None))) else repr(value)
