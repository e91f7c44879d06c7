"""Recipes: what a user runs end to end (simulation, demo, reports), composed from the core,
the exporter, the server and the device runtime, none of which imports a recipe."""
