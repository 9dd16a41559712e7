"""What is measured on a model besides accuracy: plasticity with its bounds, and a trial's GPU cost."""
