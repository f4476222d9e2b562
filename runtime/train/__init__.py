"""Training: Caffe's Solver loop, the jitted step, the solvers and their update rules, learning-rate
policies, double-float lr math, and reading solver parameters."""
