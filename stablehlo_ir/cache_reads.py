"""Reads of a tensor just written in place (a KV cache) in the forms XLA's CPU backend compiles without copying it,
applied to the module XLA compiles (a copy: the artifact keeps the plain, portable form).

XLA CPU's copy insertion copies a buffer updated in place whenever a reader could see it in another shape or
before the write; for a decode step's KV cache that is the whole cache, two or three times a call. So:

- calls and composites are inlined first (a composite's decomposition is how XLA runs it anyway), so the write
  and its readers meet in one function;
- a ``slice`` of a ``reshape`` that only adds or drops unit dims reads the reshaped tensor itself
  (``reshape(slice(x))``): the slice then reads the buffer the write made, not a second, reshaped copy of it;
  so does any other read of such a reshape inside a ``case`` branch (through a slice of the whole tensor);
- a ``dot_general`` whose right operand is a ``dynamic_update_slice`` along one dim that is not a batch dim
  reads the tensor as it was before the write, the written rows apart (exact): along a free dim, the product with
  the old rows with its written rows replaced by the product with the update; along a contracted dim, the left
  operand's columns for the written rows zeroed against the old rows plus those columns times the update. Not
  inside a ``case`` branch (XLA would then keep both the old and the new tensor: a copy).
"""
from __future__ import annotations

from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import stablehlo

from .rewrites import ops_where


def might_read_written(mlir_text: str) -> bool:
    """A cheap test for modules these rewrites may change: ones that write part of a tensor."""
    return "stablehlo.dynamic_update_slice" in mlir_text or "stablehlo.scatter" in mlir_text


def rewrite_cache_reads(module: ir.Module) -> int:
    """Apply the rewrites above to ``module`` in place (inside its context); how many reads were rewritten."""
    inline_calls(module)
    branch_reads = [(op, use) for op in ops_where(module, lambda op: _unit_reshape(op.result) if op.name ==
                                                   "stablehlo.reshape" else False)
                    for use in _uses_in_deeper_cases(op)]
    for op, user in branch_reads:
        _read_whole_as_stored(op, user)
    slices = ops_where(module, lambda op: op.name == "stablehlo.slice" and _unit_reshape(op.operands[0]))
    reshapes = {_producer(op.operands[0]) for op in slices} | {op for op, _ in branch_reads}
    for op in slices:
        _slice_before_reshape(op)
    for op in reshapes:  # left unread: XLA would otherwise hoist them, and with them a reshaped copy
        if not list(op.result.uses):
            op.erase()
    products = ops_where(module, lambda op: op.name == "stablehlo.dot_general" and not _case_depth(op))
    return len(branch_reads) + len(slices) + sum(_product_past_the_write(op) for op in products)


# -- inlining ---------------------------------------------------------------------------------------------------

def inline_calls(module: ir.Module) -> None:
    """Every ``func.call`` and ``stablehlo.composite`` replaced by its callee's body; the private functions left
    unreferenced are erased (``symbol-dce``)."""
    functions = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in module.body.operations
                 if op.operation.name == "func.func"}
    while True:
        calls = ops_where(module, lambda op: op.name in ("func.call", "stablehlo.composite"))
        if not calls:
            break
        for call in calls:
            attribute = "callee" if call.name == "func.call" else "decomposition"
            _inline(call, functions[ir.FlatSymbolRefAttr(call.attributes[attribute]).value])
    passmanager.PassManager.parse("builtin.module(symbol-dce)").run(module.operation)


def _inline(call, function) -> None:
    copy = function.operation.clone()
    block = copy.regions[0].blocks[0]
    for argument, operand in zip(block.arguments, call.operands):
        argument.replace_all_uses_with(operand)
    body = list(block.operations)
    for op in body[:-1]:
        op.operation.move_before(call)
    for result, returned in zip(call.results, body[-1].operands):
        result.replace_all_uses_with(returned)
    call.erase()
    copy.erase()


# -- slices of reshapes -------------------------------------------------------------------------------------------

def _shape(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def _non_unit(shape) -> list[int]:
    return [size for size in shape if size != 1]


def _unit_reshape(value: ir.Value) -> bool:
    """Whether ``value`` is a static ``reshape`` that only adds or drops unit dims."""
    op = _producer(value)
    return op is not None and op.name == "stablehlo.reshape" and \
        ir.RankedTensorType(value.type).has_static_shape and \
        ir.RankedTensorType(op.operands[0].type).has_static_shape and \
        _non_unit(_shape(op.operands[0])) == _non_unit(_shape(value))


def _slice_before_reshape(op) -> None:
    """``slice(reshape(x))`` (a unit-dim reshape) as ``reshape(slice(x))``."""
    reshaped = op.operands[0]
    source = _producer(reshaped).operands[0]
    starts, limits, strides = (list(ir.DenseI64ArrayAttr(op.attributes[name]))
                               for name in ("start_indices", "limit_indices", "strides"))
    # the source's non-unit dims are the reshaped value's, in order
    outer = [d for d, size in enumerate(_shape(reshaped)) if size != 1]
    inner = [d for d, size in enumerate(_shape(source)) if size != 1]
    source_starts, source_limits, source_strides = [0] * len(_shape(source)), list(_shape(source)), \
        [1] * len(_shape(source))
    for o, i in zip(outer, inner):
        source_starts[i], source_limits[i], source_strides[i] = starts[o], limits[o], strides[o]
    with ir.InsertionPoint(op), op.location:
        cut = stablehlo.slice(source, source_starts, source_limits, source_strides)
        result = stablehlo.reshape(op.results[0].type, cut)
    op.results[0].replace_all_uses_with(result)
    op.erase()


def _uses_in_deeper_cases(reshape) -> list:
    """The ops other than slices that read ``reshape``'s result inside a ``case`` it is outside of."""
    users = {use.owner for use in reshape.result.uses}
    return [user for user in users if user.name != "stablehlo.slice" and _case_depth(user) > _case_depth(reshape)]


def _read_whole_as_stored(reshape, user) -> None:
    """``user`` reads ``reshape(x)`` as ``reshape(slice(x))``, the slice whole, emitted at the start of its block
    (as the other branches' slices are: XLA then passes the branch ``x`` itself)."""
    source = reshape.operands[0]
    shape = _shape(source)
    with ir.InsertionPoint.at_block_begin(user.operation.block), reshape.location:
        whole = stablehlo.slice(source, [0] * len(shape), shape, [1] * len(shape))
        read = stablehlo.reshape(reshape.result.type, whole)
    user.operation.replace_uses_of_with(reshape.result, read)


# -- products past a write ----------------------------------------------------------------------------------------

def _product_past_the_write(op) -> bool:
    """Rewrite, in place, a ``dot_general`` whose right operand is a one-dim ``dynamic_update_slice`` (see the
    module's docstring); whether it was."""
    lhs, rhs = op.operands
    write = _producer(rhs)
    if write is None or write.name != "stablehlo.dynamic_update_slice" or not all(
            ir.RankedTensorType(v.type).has_static_shape for v in (lhs, rhs)):
        return False
    before, update, starts = write.operands[0], write.operands[1], list(write.operands)[2:]
    partial = [d for d, (a, b) in enumerate(zip(_shape(before), _shape(update))) if a != b]
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    if len(partial) != 1 or partial[0] in numbers.rhs_batching_dimensions:
        return False
    with ir.InsertionPoint(op), op.location:
        result = _past_the_write(op.results[0].type, lhs, before, update, partial[0], starts[partial[0]], numbers)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def _past_the_write(result_type, lhs, before, update, dim: int, start, numbers):
    lhs_batch, rhs_batch = list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)
    lhs_contract, rhs_contract = list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)
    shape, length = _shape(before), _shape(update)[dim]
    i64 = ir.IntegerType.get_signless(64)
    zero = _scalar(0, i64)
    start = stablehlo.clamp(zero, stablehlo.convert(ir.RankedTensorType.get([], i64), start),
                            _scalar(shape[dim] - length, i64))

    def product(result, a, b):
        return stablehlo.dot_general(result, a, b, numbers)

    if dim in rhs_contract:
        column = lhs_contract[rhs_contract.index(dim)]
        lhs_shape = _shape(lhs)
        sizes = list(lhs_shape)
        sizes[column] = length
        taken = stablehlo.dynamic_slice(lhs, [start if d == column else zero for d in range(len(sizes))], sizes)
        position = stablehlo.iota(ir.RankedTensorType.get(lhs_shape, i64), column)
        end = stablehlo.add(start, _scalar(length, i64))
        positions = ir.RankedTensorType.get(lhs_shape, i64)
        inside = stablehlo.and_(_compare(position, stablehlo.broadcast_in_dim(positions, start, []), "GE"),
                                _compare(position, stablehlo.broadcast_in_dim(positions, end, []), "LT"))
        element = ir.RankedTensorType(lhs.type).element_type
        zeros = stablehlo.broadcast_in_dim(lhs.type, stablehlo.constant(_zero(element)), [])
        kept = stablehlo.select(inside, zeros, lhs)
        return stablehlo.add(product(result_type, kept, before), product(result_type, taken, update))
    free = [d for d in range(len(shape)) if d not in rhs_batch and d not in rhs_contract]
    lhs_rank = ir.RankedTensorType(lhs.type).rank
    position = len(lhs_batch) + (lhs_rank - len(lhs_batch) - len(lhs_contract)) + free.index(dim)
    out = list(ir.RankedTensorType(result_type).shape)
    out[position] = length
    new_type = ir.RankedTensorType.get(out, ir.RankedTensorType(result_type).element_type)
    return stablehlo.dynamic_update_slice(
        product(result_type, lhs, before), product(new_type, lhs, update),
        [start if d == position else zero for d in range(len(out))])


def _scalar(number: int, element) -> ir.Value:
    return stablehlo.constant(ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], element),
                                                             ir.IntegerAttr.get(element, number)))


def _zero(element) -> ir.DenseElementsAttr:
    scalar = ir.RankedTensorType.get([], element)
    if isinstance(element, ir.IntegerType):
        return ir.DenseElementsAttr.get_splat(scalar, ir.IntegerAttr.get(element, 0))
    return ir.DenseElementsAttr.get_splat(scalar, ir.FloatAttr.get(element, 0.0))


def _compare(a: ir.Value, b: ir.Value, direction: str) -> ir.Value:
    return stablehlo.compare(a, b, stablehlo.ComparisonDirectionAttr.get(direction),
                             compare_type=stablehlo.ComparisonTypeAttr.get("SIGNED"))


# -- helpers ------------------------------------------------------------------------------------------------------

def _producer(value: ir.Value):
    owner = value.owner
    return owner.operation if isinstance(owner, ir.Operation | ir.OpView) else None


def _case_depth(op) -> int:
    """How many ``case`` ops ``op`` is inside of (within its function)."""
    depth, parent = 0, op.parent
    while parent is not None and parent.name != "func.func":
        depth += parent.name == "stablehlo.case"
        parent = parent.parent
    return depth
