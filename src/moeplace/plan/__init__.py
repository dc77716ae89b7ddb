"""What to do: the budget, expert placements, the speed model and its calibration, and the recommendation."""
