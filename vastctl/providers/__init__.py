"""GPU markets behind one narrow interface (base.Provider): the real vast.ai API (vast.py) and the embedded
simulated market (sim.py). They know no rows and no policy; vastctl.markets builds the one the config names.
"""
