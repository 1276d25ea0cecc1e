//! Fixtures shared by the tests and the fuzz targets (feature `testing`), so a fixture is
//! written once.

/// The JSON schemas the grammar's tests and the `json_schema` fuzz target draw from
/// (`tests/fixtures/json_schemas.txt`: blank-line separated blocks, `//` lines comments),
/// each as written there.
pub fn json_schemas() -> Vec<String> {
    include_str!("../../../tests/fixtures/json_schemas.txt")
        .split("\n\n")
        .map(|b| {
            b.lines()
                .filter(|l| !l.starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|b| !b.trim().is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    /// The fixture file holds five schemas, each valid JSON (a split gone wrong would leave
    /// the schema tests looping over nothing, or over halves).
    #[test]
    fn the_schema_fixture_holds_five_json_documents() {
        let schemas = super::json_schemas();
        assert_eq!(schemas.len(), 5);
        for s in &schemas {
            serde_json::from_str::<serde_json::Value>(s).unwrap_or_else(|e| panic!("{e}: {s}"));
        }
    }
}
