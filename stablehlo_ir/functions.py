"""Moving the functions of one module into another: how a module calls code lowered elsewhere (JAX's functions in
``call_jax``, the converted prefill and decode steps of a generate program)."""
from __future__ import annotations

from jaxlib.mlir import ir


def move_functions(source: ir.Module, main_name: str, body: ir.Block):
    """Move every function of ``source`` (parsed in ``body``'s context) to the module ``body``, private: ``@main``
    renamed ``main_name``, the others prefixed by it, every call among them renamed to match. Returns the moved
    ``@main``."""
    main = None
    for op in list(source.body.operations):
        old = ir.StringAttr(op.attributes["sym_name"]).value
        new = main_name if old == "main" else f"{main_name}__{old}"
        ir.SymbolTable.replace_all_symbol_uses(old, new, source.operation)
        ir.SymbolTable.set_symbol_name(op, new)
        op.attributes["sym_visibility"] = ir.StringAttr.get("private")
        main = op if old == "main" else main
    for op in list(source.body.operations):
        op.detach_from_parent()
        ir.InsertionPoint(body).insert(op)
    return main
