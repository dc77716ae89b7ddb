"""What is reported: aggregate tables, the speed model's fidelity, figures, a published folder, explained logs."""
