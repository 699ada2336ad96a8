"""GPU markets behind one narrow interface (base.Provider)."""
