"""The job tables: models, schema, connections and the statements run on them."""
