"""What several benchmark families share: the load client, the engines under test, stats."""
