"""The transformer's cost kernel over numpy arrays, in rooms that follow the order a step is computed: shapes,
layer_ops, layer_work, microbatch_pass, pipeline, then the step's other terms (data_parallel, optimizer, memory,
expansion, flops), layout, cache, step; feasibility last (docs/architecture.md, "The cost rooms")."""
