"""FlexNode, a node that holds both PD duties on one engine and the planner moves between them; map in docs/architecture.md."""
