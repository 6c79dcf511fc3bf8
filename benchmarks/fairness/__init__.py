"""``fairq bench fairness``: heavy users against light users on one engine, arms side by side."""
