"""The feedback and policy HTTP service and its storage."""
