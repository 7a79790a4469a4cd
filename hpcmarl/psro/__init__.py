"""Policy-Space Response Oracles, the parts that need no MPI: the empirical payoff table of a
growing population (`payoff`), the meta-solvers that turn it into one meta-strategy per player
(`meta_solvers`, named by `psro.meta_solver`), and the bridge that scores a meta-strategy
mixture's exploitability with OpenSpiel (`exploitability`). The PSRO schedule drives them from
the commander; each is a plain function or object, tested on games with known answers.
"""
