"""A package inside the included package: walked too."""
