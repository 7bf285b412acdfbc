"""Result files in, tables and figures out: metrics, reproduce, plots, the model check.
"""
