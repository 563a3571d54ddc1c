"""The questions a user asks of the model: one estimate, what-if, a plan, calibration, validation, error bands."""
