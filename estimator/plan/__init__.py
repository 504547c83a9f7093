"""Planning over estimates: GPU roles and layout, advice that makes a run fit, and solving for a setting."""
