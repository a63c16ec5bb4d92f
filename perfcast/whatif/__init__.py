"""What-if transformations of the dependency graph, and the optimization models built on them."""
