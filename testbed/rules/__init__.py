"""Pure rules shared by the planner, the predictor and the host processes (schedules, stripes,
stages, profiles, the figures' definitions), so all of them compute with the same code.
"""
