"""The programs that put the layers together: ``enkflow demo`` (a complete twin experiment, offline or online,
ending with its report), and the Lorenz-96 experiments
(in process, and online with the bundled runners).

An app may import every layer below the command line (experiment, online, the reports, the benchmarks); nothing
but ``enkflow.cli`` imports an app.
"""
