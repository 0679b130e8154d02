"""Problem kinds: importing this package registers every family's problem builder.

A config selects one with ``problem: {kind: <name>, params: {...}}``; the builder (registered with
``fedsolve.problems.register_problem_kind``) turns the plain problem built from the config's ``data`` and
``model`` sections into the family's problem. One module per family.
"""
