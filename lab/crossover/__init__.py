"""Where does it pay? Model-size ladders measured technique by technique, and the crossover map (issue 15)."""
