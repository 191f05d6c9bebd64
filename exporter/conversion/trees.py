"""Pytree specs read back from text (a manifest's ``in_spec``/``out_spec``): built node by node, never by importing
what the text names.

torch's ``treespec_loads`` imports any module a spec names (an enum's ``fqn``, a ``defaultdict``'s factory), and
``treespec_loads`` after importing each node type's module would run a bundle's own Python. Here a node type is
one torch has registered already, or one from a module in ``TRUSTED_MODULES`` (installed packages the caller
trusts by having installed them: builtins, collections, torch, transformers, so that ``isinstance(out,
CausalLMOutputWithPast)`` keeps working); any other type is rebuilt as a plain container (a dict where the node
names its children's keys, else a tuple), with one warning. Contexts are plain JSON (keys, or nothing); a
namedtuple's is its registered name; a ``defaultdict`` comes back as a plain dict (its factory is never imported).
"""
from __future__ import annotations

import importlib
import json
import warnings

import torch.utils._pytree as pytree

TRUSTED_MODULES = ("builtins", "collections", "torch", "transformers")
"""Packages whose registered pytree node types a spec may name (a type's module is imported only from these)."""
MAX_DEPTH = 64
_UNNAMED = pytree.NO_SERIALIZED_TYPE_NAME_FOUND
_NAMEDTUPLE, _DEFAULTDICT = "collections.namedtuple", "collections.defaultdict"


class TreeSpecError(ValueError):
    """A serialized pytree spec that cannot be read: the message says where and what was expected."""


def load_treespec(serialized: str) -> pytree.TreeSpec:
    """The TreeSpec ``serialized`` (``treespec_dumps``' JSON) describes; untrusted node types become plain
    containers (with a warning). Raises TreeSpecError."""
    try:
        protocol, root = json.loads(serialized)
    except (TypeError, ValueError, RecursionError):
        raise TreeSpecError("expected torch's treespec JSON, [protocol, node]") from None
    if protocol != 1:
        raise TreeSpecError(f"expected treespec protocol 1, got {protocol!r}")
    untrusted: set[str] = set()
    spec = _node(root, 0, untrusted)
    if untrusted:
        warnings.warn(f"the pytree names types {sorted(untrusted)} from modules not trusted to be imported here "
                      f"(trusted: {', '.join(TRUSTED_MODULES)}); they are rebuilt as plain dicts and tuples",
                      stacklevel=2)
    try:
        pytree.tree_unflatten([None] * spec.num_leaves, spec)
    except Exception as error:  # noqa: BLE001  (a registered type's own unflatten raises what it raises)
        raise TreeSpecError(f"its nodes' contexts do not fit their types ({type(error).__name__}: {error})") from None
    return spec


def _node(node, depth: int, untrusted: set[str]) -> pytree.TreeSpec:
    if depth > MAX_DEPTH:
        raise TreeSpecError(f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(node, dict) or not {"type", "context", "children_spec"} <= set(node) or \
            not isinstance(node["children_spec"], list) or not isinstance(node["type"], (str, type(None))):
        raise TreeSpecError("expected each node to be {type: text or null, context, children_spec: [...]}")
    children = [_node(child, depth + 1, untrusted) for child in node["children_spec"]]
    name, context = node["type"], node["context"]
    if name is None:
        if children or context is not None:
            raise TreeSpecError("a leaf (type null) has children or a context")
        return pytree.treespec_leaf()
    if name == _DEFAULTDICT:  # its context names a factory to import: a plain dict of the same keys instead
        keys = context.get("dict_context") if isinstance(context, dict) else None
        return pytree.TreeSpec(dict, _keys(keys, len(children)), children)
    if not isinstance(context, (str, type(None))):
        raise TreeSpecError(f"a {name} node's context is {type(context).__name__}; expected text or null")
    if name == _NAMEDTUPLE:  # the context is the class's registered name, as text
        named = _trusted_type(context) if context else None
        if named is None:
            untrusted.add(f"namedtuple {context}")
            return pytree.TreeSpec(tuple, None, children)
        return pytree.TreeSpec(pytree.namedtuple, named, children)
    context = _context(context, len(children))
    node_type = _trusted_type(name)
    if node_type is None:
        untrusted.add(name)
        return _plain(context, children)
    return pytree.TreeSpec(node_type, context, children)


def _keys(keys, count: int) -> list:
    if not isinstance(keys, list) or len(keys) != count or not all(isinstance(key, (str, int)) for key in keys):
        raise TreeSpecError(f"a node's keys {str(keys)[:60]} do not name its {count} children")
    return keys


def _context(text: str | None, count: int):
    """A node's context: nothing, a number (a deque's maxlen), a namedtuple's name, or its children's keys."""
    try:
        context = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        raise TreeSpecError(f"a node's context is not JSON: {text[:60]!r}") from None
    if isinstance(context, list):
        _keys(context, count)
    elif context is not None and not isinstance(context, (int, str)):
        raise TreeSpecError(f"a node's context is {type(context).__name__}; expected keys, a name or a number")
    return context


def _trusted_type(name: str):
    """The class registered under ``name``, importing its module only from TRUSTED_MODULES; None otherwise."""
    if name == _UNNAMED:
        return None
    module = name.rpartition(".")[0]
    if name not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE and module.split(".")[0] in TRUSTED_MODULES:
        try:
            importlib.import_module(module)
        except (ImportError, ValueError):  # no such module, or an empty name part
            return None
    return pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name)


def _plain(context, children: list) -> pytree.TreeSpec:
    if isinstance(context, list):
        return pytree.TreeSpec(dict, context, children)
    return pytree.TreeSpec(tuple, None, children)
