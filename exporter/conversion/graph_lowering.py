"""One walk over the FX graph of an ExportedProgram, emitting a StableHLO ``@main``.

``@main`` takes and returns what the program's ``Signature`` says (the one owner of that convention): the
platform index where it is lowered for several platforms (``stablehlo_ir.platforms``), its tensor inputs
(parameters, buffers, lifted constants, then user inputs) in placeholder order, then ``rng_seed`` where the
program draws random numbers; its results are the program's tensor outputs, then the
new values of the state the graph writes in place, then the true sizes of their data-dependent dims.
Each state argument is donated to its new value (``tf.aliasing_output``, as ``jax.jit(donate_argnums=...)``
emits it), so XLA updates it in place. Non-tensor placeholders are folded in as the Python values torch.export
specialised them to. A node whose rule differs between the platforms (a user's lowering for some) lowers as a
``stablehlo.case`` on the platform index, each platform's rule in its branch (``aten_lowerings.emit.platform_case``).
"""
from __future__ import annotations

import itertools
import operator
from typing import Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from torch_stablehlo.aten_lowerings import (LoweringContext, PaddedDims, fills_padding, is_padded, keeps_padding,
                                            lowered_target, lowering_for, op_name, padding_filled, per_platform,
                                            seeded_key, tensor_type, ValueFacts)
from torch_stablehlo.exported_program import STATE
from torch_stablehlo.stablehlo_ir.refine import ShapeRefinementError, refine_shapes
from torch_stablehlo.stablehlo_ir.platforms import platform_index_attributes
from torch_stablehlo.stablehlo_ir.shardy import argument_attributes, declare_mesh, replicated_results
from torch_stablehlo.stablehlo_ir.unused import erase_unused

from ..errors import LoweringError
from .inplace import VIEW_SCATTERS, functionalised
from .locations import LocationCache, describe
from ..terminal import progress
from .signature import CALL_SIZE, PLATFORM_INDEX, RNG_SEED, InputSlot, Signature

ALIASING_ATTR = "tf.aliasing_output"  # on an argument: the index of the result that may reuse its buffer


def _is_tensor_meta(meta) -> bool:
    return isinstance(meta, torch.Tensor)

def _is_size_meta(meta) -> bool:
    """A SymInt over input dims (not a data-dependent one, from ``.item()`` or ``nonzero``)."""
    return isinstance(meta, torch.SymInt) and not free_unbacked_symbols(meta)

class GraphLowering:
    """Lowers the graph of one ExportedProgram into a fresh ``ir.Module``."""

    def __init__(self, graph_module: torch.fx.GraphModule, signature: Signature, writes: dict,
                 exposed: Sequence[torch.fx.Node] = ()):
        self.graph_module = graph_module
        self.signature = signature
        # the platforms @main is lowered for, each picking the user's lowering registered for it (none: any)
        self.platforms = tuple(signature.platforms)
        self._platform_index: ir.Value | None = None  # @main's first argument where it has several platforms
        self.exposed = list(exposed)  # top-graph nodes whose values @main also returns, after everything else
        self._values: dict[torch.fx.Node, object] = {}  # the top graph's lowered values
        self.dims = PaddedDims()  # input dims, and data-dependent sizes (see aten_lowerings.data_dependent)
        self.locations = LocationCache()
        self.facts = ValueFacts()  # what the walk records about the values it lowers (aten_lowerings.value_facts)
        self._seed: ir.Value | None = None  # @main's last argument where the graph draws random numbers
        self._keys = itertools.count()
        # the top graph's in-place nodes lowered functionally (``inplace.InPlaceWrites.functional``)
        self._writes = writes

    def lower(self, context: ir.Context, function_name: str = "main") -> ir.Module:
        """Build the module: ``@main``'s arguments are the signature's tensor inputs, each located by its name."""
        placeholders = [n for n in self.graph_module.graph.nodes if n.op == "placeholder"]
        node_of = dict(zip(self.signature.inputs, placeholders))  # every slot but rng_seed is a placeholder
        slots = self.signature.main_inputs
        with context, ir.Location.unknown():
            module = ir.Module.create()
            with ir.InsertionPoint(module.body):
                arg_types = [_argument_type(slot, node_of.get(slot)) for slot in slots]
                function = func.FuncOp(function_name, (arg_types, []))
                function.attributes["sym_visibility"] = ir.StringAttr.get("public")
                block = function.add_entry_block(arg_locs=[ir.Location.name(slot.tensor.name) for slot in slots])
            if self.signature.mesh:  # SPMD: the mesh, and each argument's sharding (see stablehlo_ir.shardy)
                declare_mesh(module, self.signature.mesh)
                function.arg_attrs = argument_attributes(self.signature.main_shardings)
            argument_of, given = {}, {}
            for slot, argument in zip(slots, block.arguments):
                if slot.kind == RNG_SEED:
                    self._seed = argument
                elif slot.kind == PLATFORM_INDEX:
                    self._platform_index = argument
                elif slot.kind == CALL_SIZE:  # its dim 0 less its dim 1 is the size; bound where .item() makes it
                    given[slot.value] = argument
                elif slot.scalar:  # an int input: its symbol's value, where no input dim has it
                    argument_of[node_of[slot]] = argument
                    self.dims.bind_scalar(node_of[slot].meta["val"].node.expr, argument)
                else:
                    argument_of[node_of[slot]] = argument
                    self.dims.bind_input(argument, node_of[slot].meta["val"].shape)
            with ir.InsertionPoint(block):
                for name, argument in given.items():
                    self.dims.give(name, argument)
                inputs = [argument_of[n] if n in argument_of else n.meta.get("val") for n in placeholders]
                output = next(n for n in self.graph_module.graph.nodes if n.op == "output")
                results = [r for r, a in zip(self.lower_graph(self.graph_module, inputs), output.args[0])
                           if isinstance(a, torch.fx.Node)]  # constant outputs live in the signature
                results += self._carried_state(node_of, len(results))
                results += self._output_sizes(output)
                results += self._computed_sizes()
                results += [self._values[node] for node in self.exposed]
                func.ReturnOp(results)
            erase_unused(block)
            function.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(arg_types, [r.type for r in results]))
            marks = _donated_state(self.signature, arg_types, [r.type for r in results])
            if self._platform_index is not None:
                marks[0] = platform_index_attributes()
            _add_argument_attributes(function, len(arg_types), marks)
            if self.signature.mesh:
                function.res_attrs = replicated_results([r.type for r in results])
            try:
                module.operation.verify()
            except ir.MLIRError as error:  # a rule emitted an invalid op: say which, not just "parse failed" later
                raise LoweringError(f"the emitted StableHLO does not verify: {error}") from error
        if self.dims.bound and all(ir.RankedTensorType(t).has_static_shape for t in arg_types):
            module = _refined(module, arg_types, context)
        return module

    def _carried_state(self, node_of: dict, count: int) -> list:
        """The state the graph wrote in place: each slot's placeholder value after the walk (the signature's
        ``buffer_mutation`` outputs after the program's own ``count`` results)."""
        slots = {s.target: s for s in self.signature.state}
        return [self._values[node_of[slots[out.target]]] for out in self.signature.main_outputs[count:]]

    def _computed_sizes(self) -> list:
        """The values the graph computes for the sizes a call gives (``Signature.call_sizes``), in its order."""
        missing = [name for name in self.signature.call_sizes if name not in self.dims.computed]
        if missing:
            raise LoweringError(f"the sizes {', '.join(missing)} a call gives are not computed by the graph's .item()")
        return [self.dims.computed[name] for name in self.signature.call_sizes]

    def _output_sizes(self, output: torch.fx.Node) -> list:
        """The true sizes of the outputs' data-dependent dims, in the signature's order (``Signature.sizes``)."""
        metas = [a.meta.get("val") for a in output.args[0] if isinstance(a, torch.fx.Node)]
        sizes = []
        for name in self.signature.sizes:
            size = _size_named(metas, name)
            if not self.dims.knows(size):
                raise LoweringError(f"an output has the data-dependent size {name}, which is not made of the sizes "
                                    "of data-dependent ops' results (nonzero, unique, a bounded .item(), ...): only "
                                    "those can be returned")
            sizes.append(self.dims.actual.size(size))
        return sizes

    def lower_graph(self, graph_module: torch.fx.GraphModule, inputs: Sequence, dims: PaddedDims | None = None) -> list:
        """Lower a graph given the values of its placeholders; returns its flat outputs. ``dims``: where its
        symbolic sizes are read (a decomposition function's arguments; default: ``@main``'s). An in-place node
        that ``exporter.conversion.inplace`` functionalises is lowered as its out-of-place twin, and the node it
        writes is rebound to the result."""
        if dims is not None and dims is not self.dims:
            outer, self.dims = self.dims, dims
            try:
                return self.lower_graph(graph_module, inputs)
            finally:
                self.dims = outer
        env: dict[torch.fx.Node, object] = {}
        writes = self._writes if graph_module is self.graph_module else functionalised(graph_module)
        placeholders = iter(inputs)
        nodes = graph_module.graph.nodes
        if graph_module is self.graph_module:  # the top graph: a progress bar if it runs long on a terminal
            nodes = progress(nodes, desc="lowering", unit="node", total=len(nodes))
            self._values = env
        for node in nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "get_attr":
                env[node] = getattr(graph_module, node.target)
            elif node.op == "call_function":
                write = writes.get(node)
                env[node] = value = self._lower_call(node, env, write.twin if write else node.target)
                for view in write.through if write else ():  # the view's new value, scattered into its source
                    env[view], value = value, self._scattered_back(view, env, value)
                for rebound in write.rebinds if write else ():
                    env[rebound] = value
            elif node.op == "output":  # a tuple of outputs, or one (a while_loop's condition)
                outputs = torch.fx.node.map_aggregate(node.args[0], lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
                return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
            else:
                raise LoweringError(f"unexpected FX node kind {node.op!r} ({node.format_node()})")
        raise LoweringError("graph has no output node")

    def _scattered_back(self, view: torch.fx.Node, env: dict, part: ir.Value) -> ir.Value:
        """The tensor ``view`` was taken from, with the view's elements replaced by ``part``: the view's scatter
        (``inplace.VIEW_SCATTERS``) lowered as a node of a scratch graph whose inputs stand for the view's
        arguments (the program's graph is left as it is)."""
        scratch, values = torch.fx.Graph(), {}

        def stand_in(argument: torch.fx.Node) -> torch.fx.Node:
            placeholder = scratch.placeholder(f"argument_{len(values)}")
            placeholder.meta = dict(argument.meta)
            values[placeholder] = env[argument]
            return placeholder

        source, *rest = torch.fx.node.map_arg(view.args, stand_in)
        written = stand_in(view)
        values[written] = part
        scatter = scratch.call_function(VIEW_SCATTERS[view.target], (source, written, *rest))
        scatter.meta = dict(view.args[0].meta)
        return self._lower_call(scatter, values, scatter.target)

    def _lower_call(self, node: torch.fx.Node, env: dict, target):
        if target is operator.getitem:
            source, index = node.args
            return env[source][index]
        meta = node.meta.get("val")
        name = op_name(node.target)
        with self.locations.for_node(node, name):
            if _is_size_meta(meta):  # SymInt arithmetic: emitted from its expression
                return self.dims.size(meta)
            if isinstance(meta, torch.SymInt) and self.dims.bound and self.dims.knows(meta):
                return self.dims.actual.size(meta)  # a data-dependent size as a value: its true size
            self._check_padded_operands(node, name)
            rules = self._rules(target, node, name)
            args = torch.fx.node.map_arg(node.args, env.__getitem__)
            kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
            ctx = LoweringContext(node, self.dims, self.lower_graph, self._rng_key if self._seed is not None else None,
                                  mesh=self.signature.mesh, platforms=self.platforms,
                                  platform_index=self._platform_index, facts=self.facts)
            if self.dims.bound and fills_padding(node):  # a reduction: its padding rows set to its identity
                args = (padding_filled(ctx, args[0]), *args[1:])
            try:
                if len(set(rules.values())) == 1:
                    result = next(iter(rules.values()))(ctx, *args, **kwargs)
                else:  # a user's lowering for some platforms: each platform's in its branch
                    result = per_platform(ctx, _result_types(meta), {
                        platform: lambda branch, rule=rule: rule(branch, *args, **kwargs)
                        for platform, rule in rules.items()})
                    result = result[0] if isinstance(meta, torch.Tensor) else tuple(result)
            except LoweringError:
                raise
            except Exception as error:
                raise LoweringError(
                    f"lowering {name} failed at {describe(node)}: {type(error).__name__}: {error}\n"
                    f"  node: {node.format_node()}") from error
            self._note_sizes(meta, result)
            self.facts.record(node, args, result)
            return result

    def _rules(self, target, node: torch.fx.Node, name: str) -> dict:
        """The rule lowering ``target`` on each platform of the module (one entry, None, where it names none);
        raises LoweringError naming the platforms without one."""
        rules = {platform: lowering_for(target, platform) for platform in self.platforms or (None,)}
        missing = [platform for platform, rule in rules.items() if rule is None]
        if missing:  # checked before the walk; reachable for nested graphs and other platforms' rules
            where = f" on {', '.join(missing)} (one is registered for other platforms only)" \
                if missing != [None] and lowering_for(target) is not None else ""
            raise LoweringError(f"no lowering for {name}{where} at {describe(node)}")
        return rules

    def _note_sizes(self, meta, result) -> None:
        """Tell the shape values the torch sizes of a node's tensor results (so a broadcast to the same sizes is
        no op and a size is read from its expression, not from the tensor)."""
        if isinstance(meta, torch.Tensor) and isinstance(result, ir.Value):
            self.dims.note(result, meta.shape)
        elif isinstance(meta, (tuple, list)) and isinstance(result, (tuple, list)):
            for part_meta, part in zip(meta, result):
                self._note_sizes(part_meta, part)

    def _check_padded_operands(self, node: torch.fx.Node, name: str) -> None:
        """Raise unless ``node`` keeps the padding of the data-dependent tensors it takes (see
        ``aten_lowerings.data_dependent``): elementwise and layout ops do; reductions, sorts, reshapes, ... mix
        the padding rows into the result."""
        if not self.dims.bound:
            return
        padded = []  # sizes a call gives are exact, not padded (``Signature.call_sizes``)
        torch.fx.node.map_arg((node.args, node.kwargs), lambda a: padded.append(a) if is_padded(a) and not
                              self.dims.exact(a.meta["val"].shape) else None)
        if padded and not keeps_padding(node):
            raise LoweringError(
                f"{name} at {describe(node)} takes {padded[0].name}, whose size is data-dependent "
                f"({list(padded[0].meta['val'].shape)}, from an op such as nonzero or unique); such a tensor is "
                "held padded to its largest size, so only elementwise and layout ops may take it (and the graph "
                "may return it). Use a static-size form instead (nonzero_static, a mask with torch.where).")

    def _rng_key(self) -> ir.Value:
        return seeded_key(self._seed, next(self._keys))


def _donated_state(signature: Signature, arg_types: list, result_types: list) -> dict[int, dict]:
    """Each state argument's ``tf.aliasing_output = N``, N its new value's result (same type): PJRT compiles
    that to the executable's ``input_output_alias`` and consumes the buffer passed, so the state is updated in
    place on the device."""
    argument = {s.target: i for i, s in enumerate(signature.main_inputs) if s.kind == STATE}
    outputs = signature.main_outputs
    i32 = ir.IntegerType.get_signless(32)
    return {argument[outputs[j].target]: {ALIASING_ATTR: ir.IntegerAttr.get(i32, j)} for j in signature.state_results
            if outputs[j].target in argument and arg_types[argument[outputs[j].target]] == result_types[j]}


def _add_argument_attributes(function: func.FuncOp, count: int, added: dict[int, dict]) -> None:
    """Add ``added`` (argument -> attribute name -> value) to the ``count`` arguments' attributes."""
    if not added:
        return
    old = function.arg_attrs if "arg_attrs" in function.attributes else None
    attrs = []
    for i in range(count):
        entries = {named.name: named.attr for named in ir.DictAttr(old[i])} if old is not None else {}
        attrs.append(ir.DictAttr.get({**entries, **added.get(i, {})}))
    function.arg_attrs = ir.ArrayAttr.get(attrs)


def _result_types(meta) -> list[ir.RankedTensorType]:
    """The types of a node's tensor results, from its meta (one tensor, or a tuple or list of them)."""
    return [tensor_type(m.shape, m.dtype) for m in ([meta] if isinstance(meta, torch.Tensor) else meta)]


def _argument_type(slot: InputSlot, node: torch.fx.Node | None) -> ir.RankedTensorType:
    """A placeholder's type from its meta (symbolic dims as ``?``); ``rng_seed``'s, an int input's and a size
    argument's from its spec."""
    if node is None or slot.scalar:  # a size a call gives has a named dim: dynamic
        shape = [ir.ShapedType.get_dynamic_size() if isinstance(d, str) else d for d in slot.tensor.shape]
        return tensor_type(shape, slot.tensor.torch_dtype)
    return tensor_type(node.meta["val"].shape, node.meta["val"].dtype)


def _size_named(metas, name: str) -> torch.SymInt:
    """The output dim named ``name``."""
    return next(s for m in metas if isinstance(m, torch.Tensor) for s in m.shape
                if isinstance(s, torch.SymInt) and str(s.node.expr) == name)


def _refined(module: ir.Module, arg_types, context: ir.Context) -> ir.Module:
    """The module with the padded sizes' ``?`` dims made static (input shapes static: each is a constant)."""
    shapes = [list(ir.RankedTensorType(t).shape) for t in arg_types]
    try:
        text = refine_shapes(module.operation.get_asm(enable_debug_info=True), shapes)
    except ShapeRefinementError as error:
        raise LoweringError(f"a data-dependent size did not become static: {error}") from error
    return ir.Module.parse(text, context)


def unsupported_targets(graph_module: torch.fx.GraphModule, writes: dict | None = None) -> dict:
    """Every call target (nested graphs included) without a lowering: target -> list of nodes. In-place nodes
    the walk functionalises (``writes``, ``graph_module``'s ``exporter.conversion.inplace.functionalised``;
    computed here for a nested graph) count as their out-of-place twin."""
    missing: dict[object, list[torch.fx.Node]] = {}
    writes = functionalised(graph_module) if writes is None else writes
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            attr = getattr(graph_module, node.target)
            if isinstance(attr, torch.fx.GraphModule):
                for target, nodes in unsupported_targets(attr).items():
                    missing.setdefault(target, []).extend(nodes)
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        target = writes[node].twin if node in writes else lowered_target(node)
        if _is_size_meta(node.meta.get("val")) or lowering_for(target) is not None:
            continue
        missing.setdefault(node.target, []).append(node)
    return missing
