"""The commands of run_testbed.py: argument parsing and the list/show/plan/predict/whatif views.
"""
