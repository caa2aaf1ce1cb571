"""Code that runs inside the containers (roles copy it there); standard library only."""
