package proxy

// Hooks for the black-box tests of package proxy_test, the standard
// library's way: unexported pieces under test-only exported names.

// IsEventStream is isEventStream: whether a keyed answer is a stream,
// recorded without its body.
var IsEventStream = isEventStream

// Budget is the buffer budget (MAX_BUFFERED_BYTES) of max bytes, with the
// accounts requests take their share through.
type Budget struct{ b *budget }

// NewBudget returns a budget of max bytes (0: no bound).
func NewBudget(max int64) Budget { return Budget{&budget{max: max}} }

// Max is the bound; Used what is taken now.
func (b Budget) Max() int64  { return b.b.max }
func (b Budget) Used() int64 { return b.b.used.Load() }

// Take reserves n bytes on the budget itself, or nothing and false.
func (b Budget) Take(n int64) bool { return b.b.take(n) }

// Account opens one request's account on b.
func (b Budget) Account() Account { return Account{&account{b: b.b}} }

// Account is one request's share of a Budget; the zero Account is a nil
// account, which bounds nothing.
type Account struct{ a *account }

func (a Account) Take(n int64) bool { return a.a.take(n) }
func (a Account) Give(n int64)      { a.a.give(n) }
func (a Account) Close()            { a.a.close() }
