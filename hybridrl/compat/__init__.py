"""verl's call conventions over hybridrl's core, for code and tests written against verl.

What exists only so that verl's own names and signatures keep working lives here: DataProto's extra
members and module functions (`hybridrl.compat.verl_protocol`), and verl's module functions over the
core (`hybridrl.compat.verl_functions`). This package imports the core; the core never imports it
(tests/test_import_graph.py checks it). compat/verl_shim.py maps verl's module names onto these modules.
"""
