"""Tools above the pipeline: the ``torch-stablehlo`` command line, the OpInfo sweep and the coverage report.

They use the product (``exporter``, ``golden``); the product never imports them.
"""
