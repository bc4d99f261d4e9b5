(function(){'use strict';
const D=JSON.parse(document.getElementById('allocscope-data').textContent),S=D.strings,NS='http://www.w3.org/2000/svg';
const PHASE={forward:'#dbe9f6',backward:'#fbe3cf',optimizer:'#dcefd8'};
function bytes(b){const n=['B','KiB','MiB','GiB','TiB'];let k=0;while(b>=1024&&k<4){b/=1024;k++;}return (k?b.toFixed(b<10?2:b<100?1:0):String(b))+' '+n[k];}
function el(tag,cls,text){const e=document.createElement(tag);if(cls)e.className=cls;if(text!=null)e.textContent=text;return e;}
function sv(tag,a){const e=document.createElementNS(NS,tag);for(const k in a)e.setAttribute(k,a[k]);return e;}
function base(p){const i=p.indexOf('/');return i<0?p:p.slice(0,i);}
function last(a,v,key){let lo=0,hi=a.length-1,r=-1;while(lo<=hi){const m=(lo+hi)>>1;if(key(a[m])<=v){r=m;lo=m+1;}else hi=m-1;}return r;}
const tip=el('div','tip');tip.id='tip';document.body.appendChild(tip);
function show(ev,fill){tip.textContent='';fill(tip);tip.style.display='block';const w=tip.offsetWidth,h=tip.offsetHeight;
 let x=ev.clientX+14,y=ev.clientY+14;if(x+w>innerWidth)x=Math.max(0,ev.clientX-w-14);if(y+h>innerHeight)y=Math.max(0,ev.clientY-h-14);
 tip.style.left=x+'px';tip.style.top=y+'px';}
function hide(){tip.style.display='none';}
function add(p,text,cls){const e=el('div',cls,text);p.appendChild(e);return e;}
function frames(R,id,native,py){const s=R.stacks[id];if(!s)return[];const a=s[0],e=s[1],p=s[2],f=s.slice(3),o=[];
 for(let i=a;i<Math.min(e,a+native);i++)o.push(S[f[i]]);if(e-a>native)o.push('... '+(e-a-native)+' more frames');
 for(let i=p;i<Math.min(f.length,p+py);i++)o.push(S[f[i]]);return o;}
function stack(p,R,id){if(!id){add(p,'no stack captured','fr');return;}const s=R.stacks[id],py=s&&s[2]<s.length-3;
 for(const f of frames(R,id,py?1:4,4))add(p,f,'fr');}
function tag(l,ph){return (S[l]||'(untagged)')+' '+(S[ph]||'-');}
let sel=null;
function apply(){document.querySelectorAll('[data-g]').forEach(e=>{const on=sel!==null&&e.getAttribute('data-g')===sel;
 e.classList.toggle('sel',on);e.classList.toggle('dim',sel!==null&&!on);});document.body.classList.toggle('selecting',sel!==null);}
function select(g){sel=g===sel?null:g;apply();}
document.addEventListener('click',ev=>{const t=ev.target.closest&&ev.target.closest('.pick,polygon.layer,circle.pt');if(!t)return;
 const g=t.closest('[data-g]');if(g)select(g.getAttribute('data-g'));});
document.addEventListener('keydown',ev=>{if(ev.key==='Escape'&&sel!==null){sel=null;apply();}});
const W=1000,H=300,L=70,T=10,PW=920,PH=260;
function timeline(div){const R=D.ranks[+div.dataset.r],n=R.x.length,tot=new Array(n).fill(0);let top=1;
 R.lb.forEach(a=>a.forEach((v,i)=>tot[i]+=v));for(let i=0;i<n;i++)top=Math.max(top,tot[i],R.seg[i]);
 const X=x=>(L+PW*x/10000).toFixed(1),Y=v=>(T+PH-PH*v/top).toFixed(1);
 const svg=sv('svg',{viewBox:'0 0 '+W+' '+H,width:W,height:H,role:'img','aria-label':'memory timeline'});
 for(const b of R.bands)svg.appendChild(sv('rect',{class:'band',x:X(b[0]),y:T,width:Math.max(PW*(b[1]-b[0])/10000,0.5).toFixed(1),height:PH,fill:PHASE[base(S[b[2]])]||'#eeeeee'}));
 const below=new Array(n).fill(0);
 R.lb.forEach((a,l)=>{let up='',down='';for(let i=0;i<n;i++){up+=X(R.x[i])+','+Y(below[i]+a[i])+' ';}
  for(let i=n-1;i>=0;i--){down+=X(R.x[i])+','+Y(below[i])+' ';below[i]+=a[i];}
  svg.appendChild(sv('polygon',{class:'layer',points:up+down,fill:D.colors[l%D.colors.length],'data-l':l,'data-g':S[R.layers[l]]}));});
 let line='';for(let i=0;i<n;i++)line+=X(R.x[i])+','+Y(R.seg[i])+' ';
 svg.appendChild(sv('polyline',{points:line,fill:'none',stroke:'#333','stroke-width':1,'stroke-dasharray':'4 3','pointer-events':'none'}));
 const every=Math.max(1,Math.ceil(R.steps.length/100));
 for(let k=0;k<R.steps.length;k+=every){const x=X(R.steps[k][0]);svg.appendChild(sv('line',{x1:x,x2:x,y1:T,y2:T+PH,stroke:'#7a8691','stroke-width':0.6,'pointer-events':'none'}));}
 svg.appendChild(sv('line',{x1:L,x2:L+PW,y1:T+PH,y2:T+PH,stroke:'#333'}));svg.appendChild(sv('line',{x1:L,x2:L,y1:T,y2:T+PH,stroke:'#333'}));
 for(let k=0;k<=4;k++){const t=sv('text',{x:L-6,y:(+Y(top*k/4)+4).toFixed(1),'text-anchor':'end','font-size':11});t.textContent=bytes(Math.round(top*k/4)*1024);svg.appendChild(t);}
 const t0=sv('text',{x:L,y:H-8,'font-size':11});t0.textContent='0 s';svg.appendChild(t0);
 const t1=sv('text',{x:L+PW,y:H-8,'text-anchor':'end','font-size':11});t1.textContent=R.span?(R.span/1e9).toFixed(3)+' s':'events';svg.appendChild(t1);
 svg.addEventListener('mousemove',ev=>{const r=svg.getBoundingClientRect(),vx=(ev.clientX-r.left)*W/r.width,vy=(ev.clientY-r.top)*H/r.height;
  if(vx<L||vx>L+PW||!n){hide();return;}const xu=(vx-L)/PW*10000;let i=Math.max(0,last(R.x,xu,v=>v));
  if(i+1<n&&Math.abs(R.x[i+1]-xu)<Math.abs(R.x[i]-xu))i++;
  let l=ev.target.hasAttribute('data-l')?+ev.target.getAttribute('data-l'):-1;
  if(l<0){const v=(T+PH-vy)/PH*top;let c=0;for(let k=0;k<R.lb.length;k++){c+=R.lb[k][i];if(v<=c&&R.lb[k][i]>0){l=k;break;}}}
  const s=last(R.steps,R.x[i],m=>m[0]),b=last(R.bands,R.x[i],m=>m[0]);
  show(ev,p=>{add(p,R.title+' \u00b7 '+(R.span?(R.x[i]*R.span/1e13).toFixed(3)+' s':'sample '+i)+(s>=0?' \u00b7 step '+R.steps[s][1]:'')+
    (b>=0&&R.x[i]<=R.bands[b][1]?' \u00b7 '+S[R.bands[b][2]]:''));
   add(p,'all layers '+bytes(tot[i]*1024)+', device segments '+bytes(R.seg[i]*1024));
   if(l<0)return;const name=add(p,'');name.appendChild(el('b',null,S[R.layers[l]]));name.appendChild(document.createTextNode(': '+bytes(R.lb[l][i]*1024)+' live'));
   const runs=R.top[l],k=last(runs,i,m=>m[0]),ids=k>=0?runs[k].slice(1):[];
   if(ids.length)add(p,'largest live allocation'+(ids.length>1?'s':'')+':');
   for(const id of ids){const a=R.allocs[id];add(p,bytes(a[0])+' \u00b7 '+tag(a[3],a[4])+' \u00b7 step '+a[1]+' \u00b7 allocation #'+a[5],'alloc');stack(p,R,a[2]);}});});
 svg.addEventListener('mouseleave',hide);div.appendChild(svg);}
function heat(td,ev){const R=D.ranks[+td.closest('table').dataset.r],ids=td.dataset.t.split(' ').map(Number),sites=new Map();
 show(ev,p=>{for(const k of ids){const t=R.tags[k];add(p,tag(t[0],t[1])+': '+bytes(t[2])+' in '+t[3]+' allocation(s)');
   for(const s of t[4]){const o=sites.get(s[0])||[0,0];o[0]+=s[1];o[1]+=s[2];sites.set(s[0],o);}}
  const top=[...sites.entries()].sort((a,b)=>b[1][0]-a[1][0]).slice(0,3);
  if(top.length)add(p,'allocated at:');for(const [id,o] of top){add(p,bytes(o[0])+' in '+o[1]+' allocation(s), stack '+id,'alloc');stack(p,R,+id);}});}
document.querySelectorAll('table.heat td.c[data-t]').forEach(td=>{td.addEventListener('mousemove',ev=>heat(td,ev));td.addEventListener('mouseleave',hide);});
document.querySelectorAll('details.stack').forEach(d=>d.addEventListener('toggle',()=>{if(!d.open||d.querySelector('pre'))return;
 const s=D.ranks[+d.dataset.r].stacks[d.dataset.s];d.appendChild(el('pre',null,s?s.slice(3).map(i=>S[i]).join('\n'):''));}));
document.querySelectorAll('div.timeline').forEach(timeline);
function forward(){const box=document.getElementById('fwd');if(!box)return;const steps=new Map();
 D.ranks.forEach(R=>R.fwd.forEach(s=>steps.set(s[0],Math.max(steps.get(s[0])||0,s[1].length))));
 const list=[...steps.keys()].sort((a,b)=>a-b),most=Math.max(...steps.values());
 let step=list.filter(s=>steps.get(s)===most).pop();
 const pick=el('select');pick.id='fwd-step';for(const s of list){const o=el('option',null,'step '+s);o.value=s;pick.appendChild(o);}pick.value=step;
 const label=el('label',null,'step ');label.appendChild(pick);box.appendChild(label);const area=el('div');box.appendChild(area);
 function choose(ser){const e=ser.find(s=>s[0]===step);if(e)return e;const m=Math.max(0,...ser.map(s=>s[1].length));return ser.filter(s=>s[1].length===m).pop();}
 function draw(){area.textContent='';const series=[],names=[];
  D.ranks.forEach((R,ri)=>{const c=D.colors[ri%D.colors.length];const e=R.fwd.find(s=>s[0]===step);if(e)series.push({R,c,e,kind:'run',label:R.title+', step '+step});
   if(R.base){const b=choose(R.base);if(b)series.push({R,c,e:b,kind:'baseline',label:R.title+' baseline, step '+b[0]});}});
  for(const s of series)s.e[1].forEach(([l],k)=>{if(k>=names.length)names.push(S[l]);});
  let top=1;for(const s of series)for(const [,v] of s.e[1])top=Math.max(top,v);
  const w=1000,h=300,Lx=70,Px=900,Ty=10,Py=220,X=k=>(Lx+(names.length>1?Px*k/(names.length-1):Px/2)).toFixed(1),Y=v=>(Ty+Py-Py*v/top).toFixed(1);
  const svg=sv('svg',{viewBox:'0 0 '+w+' '+h,width:w,height:h,role:'img','aria-label':'live bytes after each layer forward',class:'fwd'});
  svg.appendChild(sv('line',{x1:Lx,x2:Lx+Px,y1:Ty+Py,y2:Ty+Py,stroke:'#333'}));svg.appendChild(sv('line',{x1:Lx,x2:Lx,y1:Ty,y2:Ty+Py,stroke:'#333'}));
  for(let k=0;k<=4;k++){const t=sv('text',{x:Lx-6,y:(+Y(top*k/4)+4).toFixed(1),'text-anchor':'end','font-size':11});t.textContent=bytes(Math.round(top*k/4)*1024);svg.appendChild(t);}
  const every=Math.max(1,Math.ceil(names.length/24));
  names.forEach((nm,k)=>{if(k%every)return;const t=sv('text',{x:X(k),y:Ty+Py+14,'text-anchor':'end','font-size':10,transform:'rotate(-35 '+X(k)+' '+(Ty+Py+14)+')','data-g':nm,class:'pick'});t.textContent=nm;svg.appendChild(t);});
  for(const s of series){let pts='';const e=s.e[1];e.forEach(([,v],k)=>{pts+=X(k)+','+Y(v)+' ';});
   const a={class:'series '+s.kind,points:pts,fill:'none',stroke:s.c,'stroke-width':2,'data-rank':s.R.title};if(s.kind==='baseline')a['stroke-dasharray']='6 4';
   svg.appendChild(sv('polyline',a));
   e.forEach(([l,v],k)=>{const c=sv('circle',{class:'pt',cx:X(k),cy:Y(v),r:4,fill:s.kind==='baseline'?'#fff':s.c,stroke:s.c,'data-g':S[l]});
    c.addEventListener('mousemove',ev=>show(ev,p=>{add(p,s.label);const b=add(p,'');b.appendChild(el('b',null,S[l]));
     b.appendChild(document.createTextNode(': '+bytes(v*1024)+' live after its forward'+(k?' ('+(v>=e[k-1][1]?'+':'-')+bytes(Math.abs(v-e[k-1][1])*1024)+' from the previous layer)':'')));}));
    c.addEventListener('mouseleave',hide);svg.appendChild(c);});}
  area.appendChild(svg);const lg=el('div','fwd-legend');for(const s of series)lg.appendChild(el('span',null,(s.kind==='baseline'?'- - ':'\u2014 ')+s.label)).style.color=s.c;area.appendChild(lg);apply();}
 pick.addEventListener('change',()=>{step=+pick.value;draw();});draw();}
forward();
})();
