pub struct BenchConfig;
pub struct BenchResult;
pub async fn bench() {}
