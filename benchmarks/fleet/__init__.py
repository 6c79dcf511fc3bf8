"""``fairq bench fleet``: many models whose engines scale with fairq's demand, to zero and back."""
