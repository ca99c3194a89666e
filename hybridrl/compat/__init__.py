"""verl's call conventions over hybridrl's core, for code and tests written against verl.

What exists only so that verl's own names and signatures keep working lives here: DataProto's extra
members and module functions (`hybridrl.compat.verl_protocol`), TensorDict conversions
(`hybridrl.compat.tensordict_utils`). This package imports the core; the core never imports it
(tests/test_import_graph.py checks it). compat/verl_shim.py maps verl's module names onto these modules.
"""
