"""The recipe files shipped with autotune (installed as `autotune.recipe_files`).

One YAML file per fix family; the loader is `autotune/recipes.py`. Add your own with
`--recipes DIR`, which adds or overrides recipes by name.
"""
