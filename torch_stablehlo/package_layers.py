"""The repository's packages in layers, bottom to top: a package imports only packages of lower layers.

This table is the one statement of the layout. ``tests/test_layering.py`` checks every import against it,
README's "Layout" table shows it (a test checks that the two agree), and every folder named here, apart from the
namespace root and the scripts folders, installs as ``torch_stablehlo.<folder>`` through the link
``torch_stablehlo/<folder> -> ../<folder>`` (``tests/test_packaging.py`` and ``.ci/wheel_smoke.py`` read the
folders from here). Adding a package is one line: a name in a layer's tuple, or a new layer's tuple.

The module imports nothing, so that build and CI scripts can read it without installing the package.
"""

NAMESPACE = "torch_stablehlo"

LAYERS: tuple[tuple[str, ...], ...] = (
    (NAMESPACE,),  # its modules besides __init__ and __main__ (which sit above everything): supported, ...
    ("quantize", "stablehlo_ir"),
    ("aten_lowerings", "runtime"),
    ("exporter",),
    ("golden", "serving"),
    ("tools", "bench"),
)

SCRIPTS = ("bench",)  # folders of scripts run from the checkout: in the table, never installed

LAYER_OF: dict[str, int] = {package: layer for layer, packages in enumerate(LAYERS) for package in packages}

# the repository folders installed as torch_stablehlo.<folder>, bottom layer first
FOLDERS: tuple[str, ...] = tuple(package for packages in LAYERS for package in packages
                                 if package != NAMESPACE and package not in SCRIPTS)
