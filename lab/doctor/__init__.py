"""lab doctor: profile one model, predict which technique pays on this machine, then check the prediction (issue 20)."""
