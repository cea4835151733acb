"""Plotly figures, one module per analysis area; every function returns a plotly.graph_objects.Figure."""
