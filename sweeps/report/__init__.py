"""Rows to frames, accuracy, tables, plots and overhead fits."""
