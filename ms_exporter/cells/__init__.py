"""Train cells a user wraps the network in: gradient norms reported from the graph, loss scaling on CPU."""
