"""Programs that put the layers together: the demo and the Lorenz-96 experiments (in process and online)."""
